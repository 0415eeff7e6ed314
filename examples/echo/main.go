// Command echo is the orders service on echo (github.com/labstack/echo/v5)
// with idemecho and sqlitestore: POST /orders creates an order in the same
// SQLite transaction as its idempotency record.
//
//	go run ./echo -db orders.db
//	curl -i -X POST localhost:8093/orders -H 'Idempotency-Key: "o-1"' \
//	  -H 'Content-Type: application/json' -d '{"item":"book","quantity":1}'
package main

import (
	"io"
	"net/http"

	"github.com/idemhq/idem/examples/internal/orders"
	"github.com/idemhq/idem/idemecho"
	"github.com/idemhq/idem/sqlitestore"
	"github.com/labstack/echo/v5"
)

func main() { orders.Main("127.0.0.1:8093", newHandler) }

func newHandler(store *sqlitestore.Store) (http.Handler, error) {
	mw, err := orders.Middleware(store)
	if err != nil {
		return nil, err
	}
	e := echo.New()
	e.POST("/orders", func(c *echo.Context) error {
		body, _ := io.ReadAll(c.Request().Body) // idem has read and bounded it already
		req, err := orders.Parse(body)
		if err != nil {
			return c.JSON(http.StatusBadRequest, map[string]string{"error": err.Error()})
		}
		// The execution's transaction comes through the request context.
		o, err := orders.Create(c.Request().Context(), req)
		if err != nil {
			return echo.NewHTTPError(http.StatusInternalServerError, "could not create the order")
		}
		return c.JSON(http.StatusCreated, o)
	}, idemecho.Middleware(mw))
	return e, nil
}

// Command gin is the orders service on gin (github.com/gin-gonic/gin) with
// idemgin and sqlitestore: POST /orders creates an order in the same SQLite
// transaction as its idempotency record.
//
//	go run ./gin -db orders.db
//	curl -i -X POST localhost:8092/orders -H 'Idempotency-Key: "o-1"' \
//	  -H 'Content-Type: application/json' -d '{"item":"book","quantity":1}'
package main

import (
	"io"
	"net/http"

	"github.com/gin-gonic/gin"
	"github.com/idemhq/idem/examples/internal/orders"
	"github.com/idemhq/idem/idemgin"
	"github.com/idemhq/idem/sqlitestore"
)

func main() { orders.Main("127.0.0.1:8092", newHandler) }

func newHandler(store *sqlitestore.Store) (http.Handler, error) {
	mw, err := orders.Middleware(store)
	if err != nil {
		return nil, err
	}
	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	r.POST("/orders", idemgin.Middleware(mw), func(c *gin.Context) {
		body, _ := io.ReadAll(c.Request.Body) // idem has read and bounded it already
		req, err := orders.Parse(body)
		if err != nil {
			c.JSON(http.StatusBadRequest, gin.H{"error": err.Error()})
			return
		}
		// The execution's transaction comes through the request context.
		o, err := orders.Create(c.Request.Context(), req)
		if err != nil {
			c.JSON(http.StatusInternalServerError, gin.H{"error": "could not create the order"})
			return
		}
		c.JSON(http.StatusCreated, o)
	})
	return r, nil
}

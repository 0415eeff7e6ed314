// Command fiber is the orders service on Fiber (github.com/gofiber/fiber/v3)
// with idemfiber and sqlitestore: POST /orders creates an order in the same
// SQLite transaction as its idempotency record. Fiber runs on fasthttp, and
// idemfiber works on Fiber's own request and response.
//
//	go run ./fiber -db orders.db
//	curl -i -X POST localhost:8096/orders -H 'Idempotency-Key: "o-1"' \
//	  -H 'Content-Type: application/json' -d '{"item":"book","quantity":1}'
package main

import (
	"context"
	"flag"
	"log"
	"net/http"
	"os/signal"
	"syscall"

	"github.com/gofiber/fiber/v3"
	"github.com/idemhq/idem"
	"github.com/idemhq/idem/examples/internal/orders"
	"github.com/idemhq/idem/idemfiber"
	"github.com/idemhq/idem/sqlitestore"
)

func main() {
	db := flag.String("db", "orders.db", "SQLite file for records and orders")
	addr := flag.String("addr", "127.0.0.1:8096", "listen address")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	store, err := orders.Open(ctx, *db)
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	app, err := newApp(store)
	if err != nil {
		log.Fatal(err)
	}
	go func() { <-ctx.Done(); _ = app.Shutdown() }()
	if err := app.Listen(*addr); err != nil {
		log.Fatal(err)
	}
}

func newApp(store *sqlitestore.Store) (*fiber.App, error) {
	mw, err := idem.NewMiddleware(store, nil)
	if err != nil {
		return nil, err
	}
	// One tenant per Authorization value, as in the other examples.
	idm, err := idemfiber.New(mw, &idemfiber.Config{
		TenantFunc: func(c fiber.Ctx) (string, error) { return orders.Tenant(c.Get("Authorization")), nil },
	})
	if err != nil {
		return nil, err
	}
	app := fiber.New()
	app.Post("/orders", idm, func(c fiber.Ctx) error {
		req, err := orders.Parse(c.Body())
		if err != nil {
			return c.Status(http.StatusBadRequest).JSON(fiber.Map{"error": err.Error()})
		}
		// The execution's transaction comes through the Ctx's context.
		o, err := orders.Create(c.Context(), req)
		if err != nil {
			return c.Status(http.StatusInternalServerError).JSON(fiber.Map{"error": "could not create the order"})
		}
		return c.Status(http.StatusCreated).JSON(o)
	})
	return app, nil
}

// Command gin is the orders service on gin (github.com/gin-gonic/gin) with
// idemgin and sqlitestore: POST /orders creates an order in the same SQLite
// transaction as its idempotency record.
//
//	go run ./gin -db orders.db
//	curl -i -X POST localhost:8092/orders -H 'Idempotency-Key: "o-1"' \
//	  -H 'Content-Type: application/json' -d '{"item":"book","quantity":1}'
package main

import (
	"context"
	"errors"
	"flag"
	"io"
	"log"
	"net/http"
	"os/signal"
	"syscall"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/idemhq/idem"
	"github.com/idemhq/idem/examples/internal/orders"
	"github.com/idemhq/idem/idemgin"
	"github.com/idemhq/idem/sqlitestore"
)

func main() {
	db := flag.String("db", "orders.db", "SQLite file for records and orders")
	addr := flag.String("addr", "127.0.0.1:8092", "listen address")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	store, err := orders.Open(ctx, *db)
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	h, err := newHandler(store)
	if err != nil {
		log.Fatal(err)
	}
	srv := &http.Server{Addr: *addr, Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go func() { <-ctx.Done(); _ = srv.Shutdown(context.Background()) }()
	log.Printf("listening on http://%s", *addr)
	if err := srv.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
		log.Fatal(err)
	}
}

func newHandler(store *sqlitestore.Store) (http.Handler, error) {
	mw, err := idem.NewMiddleware(store, &idem.Config{
		TenantFunc: func(r *http.Request) (string, error) { return orders.Tenant(r.Header.Get("Authorization")), nil },
	})
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

// Command huma is the orders service on Huma (github.com/danielgtaylor/huma/v2)
// over net/http's ServeMux (the humago adapter), with idem's net/http
// middleware and sqlitestore: POST /orders creates an order in the same
// SQLite transaction as its idempotency record.
//
// idem runs as a Huma operation middleware (idemMiddleware below), around
// the operation: Huma reads and validates the body idem has buffered, and
// writes its response through idem's recorder, so a retry replays Huma's
// response byte for byte without running the operation. The operation that
// names a record is the ServeMux pattern Huma registered ("POST /orders").
//
//	go run ./huma -db orders.db
//	curl -i -X POST localhost:8095/orders -H 'Idempotency-Key: "o-1"' \
//	  -H 'Content-Type: application/json' -d '{"item":"book","quantity":1}'
package main

import (
	"context"
	"net/http"

	"github.com/danielgtaylor/huma/v2"
	"github.com/danielgtaylor/huma/v2/adapters/humago"
	"github.com/idemhq/idem"
	"github.com/idemhq/idem/examples/internal/orders"
	"github.com/idemhq/idem/sqlitestore"
)

func main() { orders.Main("127.0.0.1:8095", newHandler) }

// createInput is the request: Huma validates it (a non-empty item, a
// positive quantity) and answers 422 application/problem+json otherwise.
type createInput struct {
	Body struct {
		Item     string `json:"item" minLength:"1" doc:"What to order"`
		Quantity int    `json:"quantity" minimum:"1" doc:"How many"`
	}
}

type createOutput struct {
	Body orders.Order
}

func newHandler(store *sqlitestore.Store) (http.Handler, error) {
	mw, err := orders.Middleware(store)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	api := humago.New(mux, huma.DefaultConfig("Orders", "1.0.0"))
	huma.Register(api, huma.Operation{
		OperationID:   "create-order",
		Method:        http.MethodPost,
		Path:          "/orders",
		DefaultStatus: http.StatusCreated,
		Middlewares:   huma.Middlewares{idemMiddleware(mw)},
	}, func(ctx context.Context, in *createInput) (*createOutput, error) {
		// ctx is the request's: it carries the execution's transaction.
		o, err := orders.Create(ctx, orders.Request{Item: in.Body.Item, Quantity: in.Body.Quantity})
		if err != nil {
			return nil, huma.Error500InternalServerError("could not create the order")
		}
		return &createOutput{Body: o}, nil
	})
	return mux, nil
}

// idemMiddleware runs a Huma operation under idem's middleware: the rest of
// the chain gets a Huma context over the request and response writer idem
// hands on (the buffered body, the execution's context, the recorder).
func idemMiddleware(mw *idem.Middleware) func(huma.Context, func(huma.Context)) {
	return func(ctx huma.Context, next func(huma.Context)) {
		r, w := humago.Unwrap(ctx)
		mw.Handle(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			next(humago.NewContext(ctx.Operation(), r, w))
		})).ServeHTTP(w, r)
	}
}

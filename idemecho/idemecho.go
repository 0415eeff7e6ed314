// Package idemecho adapts idem's middleware to echo
// (github.com/labstack/echo/v5): the same contract as idem.Middleware (keys,
// fingerprints, replays, 409/422 problems, fail closed), for routes and
// groups of an echo server.
//
//	mw, err := idem.NewMiddleware(store, nil)
//	...
//	e := echo.New()
//	e.POST("/orders", createOrder, idemecho.Middleware(mw))
//
// The handler runs at most once per key. Its response, written through the
// *echo.Context as usual, is recorded, stored and sent; a retry replays it
// without running the handler. An error the handler returns goes through
// echo's HTTPErrorHandler inside the execution, so that its response is
// what idem records (a 5xx releases the key, as with net/http). The request
// context (c.Request().Context()) carries the execution, so the
// transactional pattern works unchanged: on a transactional store a handler
// asks for its transaction with sqlitestore.Tx(c.Request().Context()) or
// pgstore.Tx, and its writes commit together with the stored response.
//
// The operation that names a record defaults to the method and echo's route
// template (c.Path(), such as "POST /orders/:id"); idem.Config.OperationFunc
// overrides it.
package idemecho

import (
	"net/http"

	"github.com/idemhq/idem"
	"github.com/labstack/echo/v5"
)

// Middleware returns echo middleware that runs the handler under m.
func Middleware(m *idem.Middleware) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c *echo.Context) error {
			outer := c.Response()
			h := m.Handle(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				// The handler writes into idem's recorder through an
				// echo.Response of its own; idem writes the final
				// response (or a replay, or a problem) to the outer one,
				// so that echo's logger sees its status.
				c.SetRequest(r)
				c.SetResponse(echo.NewResponse(w, c.Echo().Logger))
				defer c.SetResponse(outer)
				if err := next(c); err != nil {
					c.Echo().HTTPErrorHandler(c, err)
				}
			}))
			h.ServeHTTP(outer, withPattern(c))
			return nil
		}
	}
}

// withPattern returns the request with Pattern set to echo's route
// template, which idem's default OperationFunc reads (as it does ServeMux
// patterns).
func withPattern(c *echo.Context) *http.Request {
	r := c.Request()
	if p := c.Path(); p != "" && r.Pattern == "" {
		r = r.WithContext(r.Context())
		r.Pattern = r.Method + " " + p
	}
	return r
}

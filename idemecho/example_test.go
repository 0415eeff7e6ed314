package idemecho_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemecho"
	"github.com/idemhq/idem/memstore"
	"github.com/labstack/echo/v5"
)

func ExampleMiddleware() {
	store, _ := memstore.New(nil)
	mw, _ := idem.NewMiddleware(store, nil)

	e := echo.New()
	e.POST("/orders", func(c *echo.Context) error {
		return c.JSON(http.StatusCreated, map[string]string{"id": "ord_1"})
	}, idemecho.Middleware(mw))

	for range 2 {
		req := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(`{"item":"book"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", `"order-1"`)
		w := httptest.NewRecorder()
		e.ServeHTTP(w, req)
		fmt.Println(w.Code, w.Header().Get("Idempotency-Replayed"), strings.TrimSpace(w.Body.String()))
	}
	// Output:
	// 201 false {"id":"ord_1"}
	// 201 true {"id":"ord_1"}
}

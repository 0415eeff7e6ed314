package idemgin_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/gin-gonic/gin"
	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemgin"
	"github.com/idemhq/idem/memstore"
)

func ExampleMiddleware() {
	store, _ := memstore.New(nil)
	mw, _ := idem.NewMiddleware(store, nil)

	r := gin.New()
	r.POST("/orders", idemgin.Middleware(mw), func(c *gin.Context) {
		c.JSON(http.StatusCreated, gin.H{"id": "ord_1"})
	})

	for range 2 {
		req := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(`{"item":"book"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", `"order-1"`)
		w := httptest.NewRecorder()
		r.ServeHTTP(w, req)
		fmt.Println(w.Code, w.Header().Get("Idempotency-Replayed"), w.Body.String())
	}
	// Output:
	// 201 false {"id":"ord_1"}
	// 201 true {"id":"ord_1"}
}

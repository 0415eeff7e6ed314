package idemfiber_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/gofiber/fiber/v3"
	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemfiber"
	"github.com/idemhq/idem/memstore"
)

func ExampleNew() {
	store, _ := memstore.New(nil)
	mw, _ := idem.NewMiddleware(store, nil)
	idm, _ := idemfiber.New(mw, nil)

	app := fiber.New()
	app.Post("/orders", idm, func(c fiber.Ctx) error {
		return c.Status(http.StatusCreated).JSON(fiber.Map{"id": "ord_1"})
	})

	for range 2 {
		req := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(`{"item":"book"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", `"order-1"`)
		resp, _ := app.Test(req) // app.Test adapts net/http for the example only
		body, _ := io.ReadAll(resp.Body)
		fmt.Println(resp.StatusCode, resp.Header.Get("Idempotency-Replayed"), string(body))
	}
	// Output:
	// 201 false {"id":"ord_1"}
	// 201 true {"id":"ord_1"}
}

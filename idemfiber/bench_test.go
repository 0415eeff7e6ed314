package idemfiber_test

import (
	"strconv"
	"testing"

	"github.com/gofiber/fiber/v3"
	"github.com/gofiber/fiber/v3/middleware/idempotency"
	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemfiber"
	"github.com/idemhq/idem/memstore"
	"github.com/valyala/fasthttp"
)

// BenchmarkFiber serves POST /orders in process, through Fiber's fasthttp
// handler (no network), bare and behind each idempotency middleware, each
// on memory storage: "first" sends a new key per request, "replay" one key.
// Fiber's own middleware (gofiber/fiber/v3/middleware/idempotency) keys by
// X-Idempotency-Key, a 36-character value, and has no fingerprint.
func BenchmarkFiber(b *testing.B) {
	store, _ := memstore.New(&memstore.Config{MaxRecords: 1 << 26})
	mw, _ := idem.NewMiddleware(store, nil)
	idm, _ := idemfiber.New(mw, nil)
	fiberIdem := idempotency.New()

	body := []byte(`{"item":"book","quantity":1}`)
	create := func(c fiber.Ctx) error {
		c.Set("Content-Type", "application/json")
		return c.Status(fiber.StatusCreated).Send([]byte(`{"id":1,"item":"book","quantity":1}`))
	}
	apps := []struct {
		name, header string
		app          *fiber.App
	}{
		{"bare", "", fiber.New()},
		{"fiber-idempotency", "X-Idempotency-Key", fiber.New()},
		{"idemfiber", idem.HeaderKey, fiber.New()},
	}
	apps[0].app.Post("/orders", create)
	apps[1].app.Post("/orders", fiberIdem, create)
	apps[2].app.Post("/orders", idm, create)

	next := 0 // shared by every run of "first", so that -count never reuses a key
	for _, a := range apps {
		h := a.app.Handler()
		run := func(b *testing.B, key func() string) {
			var ctx fasthttp.RequestCtx
			b.ReportAllocs()
			for b.Loop() {
				ctx.Request.Reset()
				ctx.Response.Reset()
				ctx.Request.Header.SetMethod(fasthttp.MethodPost)
				ctx.Request.SetRequestURI("/orders")
				ctx.Request.Header.SetContentType("application/json")
				if a.header != "" {
					ctx.Request.Header.Set(a.header, key())
				}
				ctx.Request.SetBody(body)
				h(&ctx)
				if s := ctx.Response.StatusCode(); s != fiber.StatusCreated {
					b.Fatalf("%s: status %d: %s", a.name, s, ctx.Response.Body())
				}
			}
		}
		b.Run(a.name+"/first", func(b *testing.B) {
			run(b, func() string { next++; return uuidLike(next) })
		})
		if a.header != "" {
			b.Run(a.name+"/replay", func(b *testing.B) {
				k := uuidLike(0)
				run(b, func() string { return k })
			})
		}
	}
}

// uuidLike returns a distinct 36-character key for n, the length Fiber's
// middleware requires.
func uuidLike(n int) string {
	s := strconv.Itoa(n)
	return "00000000-0000-4000-8000-" + "000000000000"[len(s):] + s
}

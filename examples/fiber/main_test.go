package main

import (
	"net"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/gofiber/fiber/v3"
	"github.com/idemhq/idem/examples/internal/checktest"
	"github.com/idemhq/idem/examples/internal/orders"
)

// idem check passes against this example, with one order per execution
// under simultaneous duplicates.
func TestCheckPasses(t *testing.T) {
	store, err := orders.Open(t.Context(), filepath.Join(t.TempDir(), "orders.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	app, err := newApp(store)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- app.Listener(ln, fiber.ListenConfig{DisableStartupMessage: true}) }()
	t.Cleanup(func() {
		// Idle keep-alive connections would hold the shutdown up.
		http.DefaultClient.CloseIdleConnections()
		if err := app.ShutdownWithTimeout(10 * time.Second); err != nil {
			t.Error(err)
		}
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	url := "http://" + ln.Addr().String() + "/orders"
	checktest.Run(t, url, checktest.Args()...)
	checktest.OrdersMatchExecutions(t, url, store)
}

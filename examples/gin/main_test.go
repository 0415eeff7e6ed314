package main

import (
	"net/http/httptest"
	"path/filepath"
	"testing"

	"github.com/idemhq/idem/examples/internal/checktest"
	"github.com/idemhq/idem/examples/internal/orders"
)

func TestCheckPasses(t *testing.T) {
	store, err := orders.Open(t.Context(), filepath.Join(t.TempDir(), "orders.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	h, err := newHandler(store)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	checktest.Run(t, srv.URL+"/orders", checktest.Args()...)
	checktest.OrdersMatchExecutions(t, srv.URL+"/orders", store)
}

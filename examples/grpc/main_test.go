package main

import (
	"net"
	"path/filepath"
	"testing"

	"github.com/idemhq/idem/examples/internal/orders"
	"github.com/idemhq/idem/idemgrpc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
)

func TestCreateRunsOncePerKey(t *testing.T) {
	store, err := orders.Open(t.Context(), filepath.Join(t.TempDir(), "orders.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	srv, err := newServer(store)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithUnaryInterceptor(idemgrpc.UnaryClientInterceptor(nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })

	ctx := metadata.AppendToOutgoingContext(t.Context(), idemgrpc.MetadataKey, "order-1")
	first, replayed1, err := create(ctx, conn, "book")
	if err != nil {
		t.Fatal(err)
	}
	again, replayed2, err := create(ctx, conn, "book")
	if err != nil {
		t.Fatal(err)
	}
	if first != again || replayed1 || !replayed2 {
		t.Errorf("first %q (replayed %v), retry %q (replayed %v)", first, replayed1, again, replayed2)
	}
	// Without a key of its own, each call gets a fresh one.
	if _, replayed, err := create(t.Context(), conn, "book"); err != nil || replayed {
		t.Errorf("a call with a fresh key: %v, replayed %v", err, replayed)
	}
	if n, err := orders.Count(t.Context(), store); err != nil || n != 2 {
		t.Errorf("%d orders (%v), want 2", n, err)
	}
}

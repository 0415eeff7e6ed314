package main

import (
	"context"
	"net"
	"path/filepath"
	"testing"

	"github.com/idemhq/idem/examples/internal/orders"
	"github.com/idemhq/idem/idemgrpc"
	"github.com/idemhq/idem/sqlitestore"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// serve starts the example's server on a loopback port and returns its
// store and a client connection with the client interceptor.
func serve(t *testing.T) (*sqlitestore.Store, *grpc.ClientConn) {
	t.Helper()
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
	return store, conn
}

// as returns ctx for calls by the caller with token, with key when it is
// not empty.
func as(ctx context.Context, token, key string) context.Context {
	ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
	if key != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, idemgrpc.MetadataKey, key)
	}
	return ctx
}

func TestCreateRunsOncePerKey(t *testing.T) {
	t.Parallel()
	store, conn := serve(t)
	ctx := as(t.Context(), "alice", "order-1")
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
	if _, replayed, err := create(as(t.Context(), "alice", ""), conn, "book"); err != nil || replayed {
		t.Errorf("a call with a fresh key: %v, replayed %v", err, replayed)
	}
	if n, err := orders.Count(t.Context(), store); err != nil || n != 2 {
		t.Errorf("%d orders (%v), want 2", n, err)
	}
}

// Another caller who sends Alice's key (and her request) does not get her
// order: the records are scoped by caller, so Bob's call runs and creates
// his own, and each one's retries replay their own order.
func TestCallersAreIsolated(t *testing.T) {
	t.Parallel()
	store, conn := serve(t)
	alice, _, err := create(as(t.Context(), "alice", "order-1"), conn, "book")
	if err != nil {
		t.Fatal(err)
	}
	bob, replayed, err := create(as(t.Context(), "bob", "order-1"), conn, "book")
	if err != nil {
		t.Fatal(err)
	}
	if replayed || bob == alice {
		t.Fatalf("Bob, with Alice's key, got %q (replayed %v); Alice's order is %q", bob, replayed, alice)
	}
	for who, want := range map[string]string{"alice": alice, "bob": bob} {
		got, replayed, err := create(as(t.Context(), who, "order-1"), conn, "book")
		if err != nil || !replayed || got != want {
			t.Errorf("%s's retry: %q (replayed %v, %v), want a replay of %q", who, got, replayed, err, want)
		}
	}
	if n, err := orders.Count(t.Context(), store); err != nil || n != 2 {
		t.Errorf("%d orders (%v), want one per caller", n, err)
	}

	// A call that names no caller is refused before anything runs.
	ctx := metadata.AppendToOutgoingContext(t.Context(), idemgrpc.MetadataKey, "order-1")
	if _, _, err := create(ctx, conn, "book"); status.Code(err) != codes.Unauthenticated {
		t.Errorf("a call without authorization: %v, want Unauthenticated", err)
	}
	ctx = metadata.AppendToOutgoingContext(as(t.Context(), "alice", "order-2"), "authorization", "Bearer bob")
	if _, _, err := create(ctx, conn, "book"); status.Code(err) != codes.Unauthenticated {
		t.Errorf("a call naming two callers: %v, want Unauthenticated", err)
	}
	if n, err := orders.Count(t.Context(), store); err != nil || n != 2 {
		t.Errorf("%d orders (%v) after the refused calls, want 2", n, err)
	}
}

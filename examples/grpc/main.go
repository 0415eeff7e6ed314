// Command grpc is the orders service over gRPC with idemgrpc and
// sqlitestore: the unary method /examples.Orders/Create takes the item as
// a google.protobuf.StringValue and answers the order as JSON in another,
// writing the order in the same SQLite transaction as its idempotency
// record. The service is declared with a hand-written grpc.ServiceDesc, so
// the example needs no code generation.
//
// Records are scoped by caller (idemgrpc.ServerOptions.TenantFunc): each
// call carries "authorization: Bearer TOKEN" metadata, the token standing in
// for real authentication, and a call without it is refused
// (Unauthenticated). Two callers who send the same key get an order each;
// without the scope, the second would get the first one's order replayed.
//
//	go run ./grpc -db orders.db                 # serve on 127.0.0.1:8096
//	go run ./grpc -call book                    # create an order as alice through the client interceptor
//	go run ./grpc -call book -token bob -key order-1
package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"net"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/examples/internal/orders"
	"github.com/idemhq/idem/idemgrpc"
	"github.com/idemhq/idem/sqlitestore"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// createMethod is the full name of the one method.
const createMethod = "/examples.Orders/Create"

func main() {
	db := flag.String("db", "orders.db", "SQLite file for records and orders")
	addr := flag.String("addr", "127.0.0.1:8096", "listen (or, with -call, dial) address")
	item := flag.String("call", "", "act as a client: create an order for this item")
	key := flag.String("key", "", "with -call: the idempotency key (default: a fresh one, kept across retries)")
	token := flag.String("token", "alice", "with -call: the caller's bearer token (it names the caller)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	if *item != "" {
		conn, err := grpc.NewClient(*addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithUnaryInterceptor(idemgrpc.UnaryClientInterceptor(nil)))
		if err != nil {
			log.Fatal(err)
		}
		defer conn.Close()
		// Plain metadata over an insecure loopback connection: a real
		// client sends its credentials over TLS (grpc.WithPerRPCCredentials).
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+*token)
		if *key != "" {
			ctx = metadata.AppendToOutgoingContext(ctx, idemgrpc.MetadataKey, *key)
		}
		reply, replayed, err := create(ctx, conn, *item)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%s (replayed: %v)\n", reply, replayed)
		return
	}

	store, err := orders.Open(ctx, *db)
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	srv, err := newServer(store)
	if err != nil {
		log.Fatal(err)
	}
	lis, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatal(err)
	}
	go func() { <-ctx.Done(); srv.GracefulStop() }()
	log.Printf("serving gRPC on %s", lis.Addr())
	if err := srv.Serve(lis); err != nil {
		log.Fatal(err)
	}
}

// create calls Create and reports whether the reply was replayed.
func create(ctx context.Context, conn *grpc.ClientConn, item string) (string, bool, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	out := new(wrapperspb.StringValue)
	var header metadata.MD
	if err := conn.Invoke(ctx, createMethod, wrapperspb.String(item), out, grpc.Header(&header)); err != nil {
		return "", false, err
	}
	r := header.Get(idemgrpc.MetadataReplayed)
	return out.GetValue(), len(r) == 1 && r[0] == "true", nil
}

// newServer returns the gRPC server with the idem interceptor on store,
// scoping records by caller.
func newServer(store *sqlitestore.Store) (*grpc.Server, error) {
	exec, err := idem.NewExecutor(store, nil)
	if err != nil {
		return nil, err
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(idemgrpc.UnaryServerInterceptor(exec, &idemgrpc.ServerOptions{
		TenantFunc: caller,
	})))
	srv.RegisterService(&ordersDesc, ordersServer{})
	return srv, nil
}

// caller returns who a call comes from, from its one "authorization:
// Bearer TOKEN" metadata entry; any other call is refused with
// Unauthenticated before its key is claimed. A real service returns the
// principal its authentication verified. The token itself is not the
// tenant: the scope is stored with every record, so the tenant is the
// token's SHA-256 (32 hex digits), which keeps the token out of the store.
func caller(ctx context.Context) (string, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	v := md.Get("authorization")
	token, ok := "", len(v) == 1
	if ok {
		token, ok = strings.CutPrefix(v[0], "Bearer ")
	}
	if !ok || token == "" {
		return "", status.Error(codes.Unauthenticated, `send one "authorization: Bearer TOKEN" metadata entry`)
	}
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:16]), nil
}

type ordersServer struct{}

func (ordersServer) create(ctx context.Context, in *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
	// The execution's transaction comes through the context.
	o, err := orders.Create(ctx, orders.Request{Item: in.GetValue(), Quantity: 1})
	if err != nil {
		return nil, status.Error(codes.Unavailable, "could not create the order")
	}
	b, _ := json.Marshal(o)
	return wrapperspb.String(string(b)), nil
}

var ordersDesc = grpc.ServiceDesc{
	ServiceName: "examples.Orders",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Create",
		Handler: func(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
			in := new(wrapperspb.StringValue)
			if err := dec(in); err != nil {
				return nil, err
			}
			if in.GetValue() == "" {
				return nil, status.Error(codes.InvalidArgument, "the item is empty")
			}
			h := func(ctx context.Context, req any) (any, error) {
				return srv.(ordersServer).create(ctx, req.(*wrapperspb.StringValue))
			}
			if interceptor == nil {
				return h(ctx, in)
			}
			return interceptor(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: createMethod}, h)
		},
	}},
}

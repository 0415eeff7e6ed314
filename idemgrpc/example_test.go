package idemgrpc_test

import (
	"log"
	"net"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemgrpc"
	"github.com/idemhq/idem/memstore"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

func ExampleUnaryServerInterceptor() {
	store, _ := memstore.New(nil) // sqlitestore, pgstore or redisstore across processes
	exec, err := idem.NewExecutor(store, nil)
	if err != nil {
		log.Fatal(err)
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(idemgrpc.UnaryServerInterceptor(exec, nil)))
	// Register services on srv, then serve.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	go srv.Serve(lis)
	defer srv.Stop()
}

func ExampleUnaryClientInterceptor() {
	conn, err := grpc.NewClient("127.0.0.1:50051",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		// Every call gets a key, kept across its retries.
		grpc.WithUnaryInterceptor(idemgrpc.UnaryClientInterceptor(nil)))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
}

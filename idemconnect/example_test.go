package idemconnect_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"

	"connectrpc.com/connect"
	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemconnect"
	"github.com/idemhq/idem/memstore"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

func Example() {
	store, _ := memstore.New(nil) // sqlitestore, pgstore or redisstore across processes
	exec, err := idem.NewExecutor(store, nil)
	if err != nil {
		log.Fatal(err)
	}
	runs := 0
	const procedure = "/orders.v1.Orders/Create"
	mux := http.NewServeMux()
	// Generated code: ordersv1connect.NewOrdersHandler(svc, connect.WithInterceptors(...)).
	mux.Handle(procedure, connect.NewUnaryHandler(procedure,
		func(_ context.Context, req *connect.Request[wrapperspb.StringValue]) (*connect.Response[wrapperspb.StringValue], error) {
			runs++
			return connect.NewResponse(wrapperspb.String(fmt.Sprintf("order %d for %s", runs, req.Msg.GetValue()))), nil
		},
		connect.WithInterceptors(idemconnect.NewHandlerInterceptor(exec, nil))))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	client := connect.NewClient[wrapperspb.StringValue, wrapperspb.StringValue](srv.Client(), srv.URL+procedure,
		connect.WithInterceptors(idemconnect.NewClientInterceptor(nil)))
	for range 2 {
		// The same key twice, as a retry after a lost reply sends it.
		req := connect.NewRequest(wrapperspb.String("book"))
		req.Header().Set(idemconnect.HeaderKey, `"order-1"`)
		res, err := client.CallUnary(context.Background(), req)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(res.Msg.GetValue(), res.Header().Get(idemconnect.HeaderReplayed))
	}
	// Without a key, the client interceptor sends a fresh one.
	res, err := client.CallUnary(context.Background(), connect.NewRequest(wrapperspb.String("lamp")))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res.Msg.GetValue(), res.Header().Get(idemconnect.HeaderReplayed))
	// Output:
	// order 1 for book false
	// order 1 for book true
	// order 2 for lamp false
}

package idemconnect_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemconnect"
	"github.com/idemhq/idem/idemstore"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Every protocol: the first call runs, a retry with the key gets the same
// reply, headers and trailers without running the handler, and idem's
// headers say which is which.
func TestExecuteAndReplayOnEveryProtocol(t *testing.T) {
	t.Parallel()
	for _, p := range protocols {
		t.Run(p.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, newStore(t), nil)
			c := b.client(t, createProc, p.opts...)
			first, err := call(t, c, `"k-1"`, "alice")
			if err != nil {
				t.Fatal(err)
			}
			again, err := call(t, c, `"k-1"`, "alice")
			if err != nil {
				t.Fatal(err)
			}
			if !proto.Equal(first.Msg, again.Msg) || !strings.HasPrefix(again.Msg.GetValue(), "order for alice #") {
				t.Errorf("replay %v, want %v", again.Msg, first.Msg)
			}
			if n := b.orders.runs.Load(); n != 1 {
				t.Errorf("handler ran %d times", n)
			}
			if header(first.Header(), idemconnect.HeaderReplayed) != "false" || header(again.Header(), idemconnect.HeaderReplayed) != "true" {
				t.Errorf("Idempotency-Replayed: first %q, replay %q", header(first.Header(), idemconnect.HeaderReplayed),
					header(again.Header(), idemconnect.HeaderReplayed))
			}
			for _, r := range []*connect.Response[wrapperspb.StringValue]{first, again} {
				if _, err := time.Parse(time.RFC3339, header(r.Header(), idemconnect.HeaderExpiresAt)); err != nil {
					t.Errorf("Idempotency-Key-Expires-At: %v", err)
				}
				if header(r.Header(), "X-Order-Run") != "run" || header(r.Trailer(), "X-Ledger") != "booked" ||
					header(r.Header(), "X-Via-Call-Info") != "set" {
					t.Errorf("handler's fields: header %v, trailer %v", r.Header(), r.Trailer())
				}
			}
			// The bare key form names the same record.
			if r, err := call(t, c, `k-1`, "alice"); err != nil || !proto.Equal(r.Msg, first.Msg) {
				t.Errorf("bare key: %v %v", r, err)
			}
		})
	}
}

// A record is shared by the protocols: a retry over gRPC of a call made
// with the Connect protocol and JSON replays it.
func TestReplayAcrossProtocols(t *testing.T) {
	t.Parallel()
	b := setup(t, newStore(t), nil)
	first, err := call(t, b.client(t, createProc, connect.WithProtoJSON()), "x-proto", "bob")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range protocols {
		r, err := call(t, b.client(t, createProc, p.opts...), "x-proto", "bob")
		if err != nil || !proto.Equal(r.Msg, first.Msg) || header(r.Header(), idemconnect.HeaderReplayed) != "true" {
			t.Errorf("%s: %v %v", p.name, r, err)
		}
	}
	if n := b.orders.runs.Load(); n != 1 {
		t.Errorf("handler ran %d times", n)
	}
}

// On the wire, the replay's body is the first response's, byte for byte, in
// both codecs of the Connect protocol.
func TestReplayIsByteIdentical(t *testing.T) {
	t.Parallel()
	b := setup(t, newStore(t), nil)
	msg, _ := proto.Marshal(wrapperspb.String("carol"))
	for _, tc := range []struct{ contentType, body, key string }{
		{"application/proto", string(msg), "raw-proto"},
		{"application/json", `"carol"`, "raw-json"},
	} {
		send := func() (int, []byte, http.Header) {
			req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, b.srv.URL+createProc, strings.NewReader(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Content-Type", tc.contentType)
			req.Header.Set("Connect-Protocol-Version", "1")
			req.Header.Set(idemconnect.HeaderKey, `"`+tc.key+`"`)
			resp, err := b.srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Fatal(err)
			}
			return resp.StatusCode, body, resp.Header
		}
		s1, b1, h1 := send()
		s2, b2, h2 := send()
		if s1 != 200 || s2 != 200 || !bytes.Equal(b1, b2) || len(b1) == 0 {
			t.Errorf("%s: %d %q, then %d %q", tc.contentType, s1, b1, s2, b2)
		}
		if h1.Get(idemconnect.HeaderReplayed) != "false" || h2.Get(idemconnect.HeaderReplayed) != "true" {
			t.Errorf("%s: Idempotency-Replayed %q then %q", tc.contentType, h1.Get(idemconnect.HeaderReplayed), h2.Get(idemconnect.HeaderReplayed))
		}
	}
	if n := b.orders.runs.Load(); n != 2 {
		t.Errorf("handler ran %d times for two keys", n)
	}
}

// A stored error comes back as the same error: code, message, details and
// metadata; a released one lets the retry run again.
func TestStoredErrorIsReplayedReleasedIsNot(t *testing.T) {
	t.Parallel()
	for _, p := range protocols {
		t.Run(p.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, newStore(t), nil)
			c := b.client(t, createProc, p.opts...)
			_, err1 := call(t, c, "nf", "missing")
			_, err2 := call(t, c, "nf", "missing")
			for i, err := range []error{err1, err2} {
				ce := new(connect.Error)
				if !errors.As(err, &ce) || ce.Code() != connect.CodeNotFound || ce.Message() != "no such customer" ||
					ce.Meta().Get("X-Lookup") != "customers-db" {
					t.Fatalf("attempt %d: %v, meta %v", i+1, err, ce.Meta())
				}
				var info *errdetails.ResourceInfo
				for _, d := range ce.Details() {
					if v, err := d.Value(); err == nil {
						info, _ = v.(*errdetails.ResourceInfo)
					}
				}
				if len(ce.Details()) != 1 || info.GetResourceName() != "c-404" {
					t.Errorf("attempt %d: details %v", i+1, ce.Details())
				}
			}
			if r := new(connect.Error); errors.As(err2, &r) && r.Meta().Get(idemconnect.HeaderReplayed) != "true" {
				t.Errorf("replayed error: Idempotency-Replayed %q", r.Meta().Get(idemconnect.HeaderReplayed))
			}
			if n := b.orders.runs.Load(); n != 1 {
				t.Errorf("a stored NotFound ran the handler %d times", n)
			}
			b.orders.failN.Store(1)
			if _, err := call(t, c, "tr", "dave"); connect.CodeOf(err) != connect.CodeUnavailable || idemconnect.Reason(err) != "" {
				t.Fatalf("first: %v", err)
			}
			if _, err := call(t, c, "tr", "dave"); err != nil {
				t.Fatalf("retry after a released Unavailable: %v", err)
			}
			if n := b.orders.runs.Load(); n != 3 {
				t.Errorf("handler ran %d times, want 3", n)
			}
		})
	}
}

// Simultaneous duplicates: exactly one runs, the others are told Aborted
// with RetryInfo while it is still running (the handler is held until every
// duplicate has its answer, so they really overlapped), and a retry after it
// finished gets its reply.
func TestConcurrentDuplicatesRunOnce(t *testing.T) {
	t.Parallel()
	for _, p := range protocols {
		t.Run(p.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, newStore(t), nil)
			c := b.client(t, createProc, p.opts...)
			const n = 8
			start := make(chan struct{})
			type result struct {
				r   *connect.Response[wrapperspb.StringValue]
				err error
			}
			results := make(chan result, n)
			var wg sync.WaitGroup
			for range n {
				wg.Go(func() {
					<-start
					r, err := call(t, c, "dup", "hold")
					results <- result{r, err}
				})
			}
			close(start)
			b.waitEntered(t, 1)
			var won *connect.Response[wrapperspb.StringValue]
			for range n - 1 {
				res := <-results
				wantCode(t, "duplicate in flight", res.err, connect.CodeAborted, idem.CodeRequestInProgress)
				if d, ok := idemconnect.RetryDelay(res.err); !ok || d != idem.DefaultRetryAfter {
					t.Errorf("RetryInfo %v %v", d, ok)
				}
				if ce := new(connect.Error); errors.As(res.err, &ce) && ce.Meta().Get("Retry-After") != "1" {
					t.Errorf("Retry-After %q", ce.Meta().Get("Retry-After"))
				}
			}
			close(b.orders.hold)
			res := <-results
			if res.err != nil {
				t.Fatalf("the call that ran: %v", res.err)
			}
			won = res.r
			wg.Wait()
			if runs := b.orders.runs.Load(); runs != 1 {
				t.Errorf("%d simultaneous duplicates ran the handler %d times", n, runs)
			}
			r, err := call(t, c, "dup", "hold")
			if err != nil || !proto.Equal(r.Msg, won.Msg) {
				t.Errorf("after completion: %v %v", r, err)
			}
		})
	}
}

func TestReusedMissingAndInvalidKeys(t *testing.T) {
	t.Parallel()
	for _, p := range protocols {
		t.Run(p.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, newStore(t), nil)
			c := b.client(t, createProc, p.opts...)
			if _, err := call(t, c, "k", "erin"); err != nil {
				t.Fatal(err)
			}
			_, err := call(t, c, "k", "frank")
			wantCode(t, "reused key", err, connect.CodeFailedPrecondition, idem.CodeKeyReused)
			if ce := new(connect.Error); errors.As(err, &ce) && ce.Meta().Get(idemconnect.HeaderExpiresAt) == "" {
				t.Error("key_reused without Idempotency-Key-Expires-At")
			}
			_, err = call(t, c, "", "erin")
			wantCode(t, "missing key", err, connect.CodeInvalidArgument, idem.CodeKeyMissing)
			_, err = call(t, c, strings.Repeat("k", idem.MaxKeyLength+1), "erin")
			wantCode(t, "too long a key", err, connect.CodeInvalidArgument, idem.CodeKeyInvalid)
			_, err = call(t, c, "a", "erin", idemconnect.HeaderKey, "b")
			wantCode(t, "two keys", err, connect.CodeInvalidArgument, idem.CodeKeyInvalid)
			if n := b.orders.runs.Load(); n != 1 {
				t.Errorf("handler ran %d times", n)
			}
		})
	}
}

// downStore fails every claim, as an unreachable database does.
type downStore struct{ idemstore.Store }

func (downStore) Claim(context.Context, idemstore.ClaimParams) (idemstore.ClaimResult, error) {
	return idemstore.ClaimResult{}, errors.New("connection refused")
}

func TestStoreDownIsUnavailable(t *testing.T) {
	t.Parallel()
	b := setup(t, downStore{newStore(t)}, nil)
	for _, p := range protocols {
		_, err := call(t, b.client(t, createProc, p.opts...), "k", "gina")
		wantCode(t, p.name+": store down", err, connect.CodeUnavailable, idem.CodeStoreUnavailable)
		if _, ok := idemconnect.RetryDelay(err); !ok {
			t.Errorf("%s: no RetryInfo on Unavailable", p.name)
		}
	}
	if n := b.orders.runs.Load(); n != 0 {
		t.Errorf("the handler ran %d times with the store down", n)
	}
}

// Tenants never see each other's records: the same key from another tenant
// runs again (with the same or another message), and a TenantFunc error is
// answered without running anything.
func TestTenantIsolation(t *testing.T) {
	t.Parallel()
	b := setup(t, newStore(t), &idemconnect.HandlerOptions{
		TenantFunc: func(_ context.Context, req connect.AnyRequest) (string, error) {
			switch a := req.Header().Get("Authorization"); a {
			case "":
				return "", connect.NewError(connect.CodeUnauthenticated, errors.New("sign in"))
			case "Bearer bad":
				return "", errors.New("malformed token")
			default:
				return a, nil
			}
		},
	})
	c := b.client(t, createProc, connect.WithGRPC())
	a, err := call(t, c, "shared", "order-1", "Authorization", "Bearer a")
	if err != nil {
		t.Fatal(err)
	}
	bsame, err := call(t, c, "shared", "order-1", "Authorization", "Bearer b")
	if err != nil || proto.Equal(a.Msg, bsame.Msg) || header(bsame.Header(), idemconnect.HeaderReplayed) != "false" {
		t.Errorf("tenant b, a's key and message: %v %v (tenant a's reply: %v)", bsame, err, a.Msg)
	}
	if _, err := call(t, c, "shared", "order-2", "Authorization", "Bearer c"); err != nil {
		t.Errorf("tenant c, a's key, another message: %v", err)
	}
	if r, err := call(t, c, "shared", "order-1", "Authorization", "Bearer a"); err != nil || !proto.Equal(r.Msg, a.Msg) {
		t.Errorf("tenant a's retry: %v %v", r, err)
	}
	_, err = call(t, c, "shared", "order-1")
	if connect.CodeOf(err) != connect.CodeUnauthenticated || idemconnect.Reason(err) != "" {
		t.Errorf("TenantFunc's connect error: %v", err)
	}
	_, err = call(t, c, "shared", "order-1", "Authorization", "Bearer bad")
	wantCode(t, "TenantFunc's plain error", err, connect.CodeInvalidArgument, idem.CodeScopeInvalid)
	if n := b.orders.runs.Load(); n != 3 {
		t.Errorf("handler ran %d times, want 3", n)
	}
}

// A procedure marked NO_SIDE_EFFECTS needs no key (and is protected when it
// carries one), also over HTTP GET.
func TestSideEffectFreeProcedureNeedsNoKey(t *testing.T) {
	t.Parallel()
	b := setup(t, newStore(t), nil)
	c := b.client(t, getProc, connect.WithHTTPGet(), connect.WithIdempotency(connect.IdempotencyNoSideEffects))
	for range 2 {
		if _, err := call(t, c, "", "helen"); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 {
		if _, err := call(t, c, "g", "helen"); err != nil {
			t.Fatal(err)
		}
	}
	if n := b.orders.runs.Load(); n != 3 {
		t.Errorf("handler ran %d times, want 3", n)
	}
}

// A handler registered without a schema replays in JSON too: the record
// names its reply type.
func TestReplayWithoutSchema(t *testing.T) {
	t.Parallel()
	b := setup(t, newStore(t), nil)
	c := b.client(t, plainProc, connect.WithProtoJSON())
	first, err := call(t, c, "p", "ivan")
	if err != nil {
		t.Fatal(err)
	}
	again, err := call(t, c, "p", "ivan")
	if err != nil || !proto.Equal(first.Msg, again.Msg) || b.orders.runs.Load() != 1 {
		t.Errorf("replay %v %v after %d runs, want %v", again, err, b.orders.runs.Load(), first.Msg)
	}
}

// Streams pass through the interceptors on both sides, with or without a
// key, and get none of idem's headers.
func TestStreamingIsUnaffected(t *testing.T) {
	t.Parallel()
	b := setup(t, newStore(t), nil)
	c := connect.NewClient[wrapperspb.StringValue, wrapperspb.StringValue](b.srv.Client(), b.srv.URL+watchProc,
		connect.WithGRPC(), connect.WithInterceptors(idemconnect.NewClientInterceptor(nil)))
	for _, key := range []string{"", "s", "s"} {
		req := connect.NewRequest(wrapperspb.String("w"))
		if key != "" {
			req.Header().Set(idemconnect.HeaderKey, key)
		}
		s, err := c.CallServerStream(t.Context(), req)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for s.Receive() {
			got = append(got, s.Msg().GetValue())
		}
		if err := s.Err(); err != nil || strings.Join(got, ",") != "w0,w1,w2" {
			t.Errorf("key %q: %q %v", key, got, err)
		}
		if s.ResponseHeader().Get(idemconnect.HeaderReplayed) != "" {
			t.Errorf("key %q: a stream got idem's headers", key)
		}
		s.Close()
	}
	if n := b.orders.runs.Load(); n != 3 {
		t.Errorf("the stream ran %d times, want 3", n)
	}
}

// Each interceptor refuses to work on the wrong side, loudly.
func TestInterceptorsOnTheWrongSide(t *testing.T) {
	t.Parallel()
	exec, err := idem.NewExecutor(newStore(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	b := setup(t, newStore(t), nil)
	c := b.client(t, createProc, connect.WithInterceptors(idemconnect.NewHandlerInterceptor(exec, nil)))
	if _, err := call(t, c, "k", "judy"); connect.CodeOf(err) != connect.CodeInternal || !strings.Contains(err.Error(), "NewClientInterceptor") {
		t.Errorf("handler interceptor on a client: %v", err)
	}
	mux := http.NewServeMux()
	mux.Handle(createProc, connect.NewUnaryHandler(createProc, b.orders.create,
		connect.WithInterceptors(idemconnect.NewClientInterceptor(nil))))
	srv := httpServer(t, mux)
	c = connect.NewClient[wrapperspb.StringValue, wrapperspb.StringValue](srv.Client(), srv.URL+createProc)
	if _, err := call(t, c, "k", "judy"); connect.CodeOf(err) != connect.CodeInternal || !strings.Contains(err.Error(), "NewHandlerInterceptor") {
		t.Errorf("client interceptor on a handler: %v", err)
	}
	if n := b.orders.runs.Load(); n != 0 {
		t.Errorf("handler ran %d times", n)
	}
}

// An OutcomeFunc that releases a success sends the reply as it is and
// frees the key: the retry runs again.
func TestReleasedSuccessIsSentUnstored(t *testing.T) {
	t.Parallel()
	b := setup(t, newStore(t), &idemconnect.HandlerOptions{
		OutcomeFunc: func(connect.Code) idem.Outcome { return idem.OutcomeRelease },
	})
	c := b.client(t, createProc)
	for i := range 2 {
		r, err := call(t, c, "rel", "olga")
		if err != nil || !strings.HasPrefix(r.Msg.GetValue(), "order for olga") {
			t.Fatalf("call %d: %v %v", i+1, r, err)
		}
	}
	if n := b.orders.runs.Load(); n != 2 {
		t.Errorf("handler ran %d times, want 2", n)
	}
}

// Fields an interceptor outside idem's sets on each attempt are not part of
// the stored reply: a replay carries the replay's own, once.
func TestOuterInterceptorFieldsAreNotStored(t *testing.T) {
	t.Parallel()
	exec, err := idem.NewExecutor(newStore(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	var attempt atomic.Int64
	outer := connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			if info, ok := connect.CallInfoForHandlerContext(ctx); ok {
				info.ResponseHeader().Set("X-Attempt", strconv.FormatInt(attempt.Add(1), 10))
			}
			return next(ctx, req)
		}
	})
	o := &orders{}
	mux := http.NewServeMux()
	mux.Handle(createProc, connect.NewUnaryHandler(createProc, o.create, connect.WithSchema(method("Create")),
		connect.WithInterceptors(outer, idemconnect.NewHandlerInterceptor(exec, nil))))
	srv := httpServer(t, mux)
	c := connect.NewClient[wrapperspb.StringValue, wrapperspb.StringValue](srv.Client(), srv.URL+createProc)
	for i := 1; i <= 2; i++ {
		r, err := call(t, c, "o", "pat")
		if err != nil {
			t.Fatal(err)
		}
		if got := header(r.Header(), "X-Attempt"); got != strconv.Itoa(i) || header(r.Header(), "X-Via-Call-Info") != "set" {
			t.Errorf("attempt %d: X-Attempt %q, X-Via-Call-Info %q", i, got, header(r.Header(), "X-Via-Call-Info"))
		}
	}
	if o.runs.Load() != 1 {
		t.Errorf("handler ran %d times", o.runs.Load())
	}
}

package payments

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemstore"
	"github.com/idemhq/idem/pgstore"
)

// fakeProvider is a card provider whose answer each test decides; it
// counts the charges it is sent and the keys they carry.
type fakeProvider struct {
	*httptest.Server
	answer atomic.Pointer[http.HandlerFunc]
	calls  atomic.Int32
	mu     sync.Mutex
	keys   map[string]int
}

func newFakeProvider(t *testing.T, answer http.HandlerFunc) *fakeProvider {
	t.Helper()
	fp := &fakeProvider{keys: map[string]int{}}
	fp.set(answer)
	fp.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fp.calls.Add(1)
		fp.mu.Lock()
		fp.keys[r.Header.Get(idem.HeaderKey)]++
		fp.mu.Unlock()
		(*fp.answer.Load())(w, r)
	}))
	t.Cleanup(fp.Close)
	return fp
}

func (fp *fakeProvider) set(h http.HandlerFunc) { fp.answer.Store(&h) }

// distinctKeys is the number of different Idempotency-Keys sent.
func (fp *fakeProvider) distinctKeys() int {
	fp.mu.Lock()
	defer fp.mu.Unlock()
	return len(fp.keys)
}

// answerWith answers status with body (as problem+json for a 4xx or 5xx,
// JSON otherwise) and header fields kv.
func answerWith(status int, body string, kv ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		ct := "application/json"
		if status >= 400 {
			ct = "application/problem+json"
		}
		w.Header().Set("Content-Type", ct)
		for i := 0; i+1 < len(kv); i += 2 {
			w.Header().Set(kv[i], kv[i+1])
		}
		w.WriteHeader(status)
		fmt.Fprint(w, body)
	}
}

const cardDeclined = `{"type":"about:blank","title":"The card was declined","status":402,"detail":"Insufficient funds.","code":"card_declined"}`

// observed is a ChargeObserver that counts.
type observed struct {
	mu       sync.Mutex
	attempts map[string]int
	retries  int
	outcomes map[string]int
}

func (o *observed) ChargeAttempt(answer string, retry bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.attempts == nil {
		o.attempts = map[string]int{}
	}
	o.attempts[answer]++
	if retry {
		o.retries++
	}
}

func (o *observed) ChargeOutcome(outcome string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.outcomes == nil {
		o.outcomes = map[string]int{}
	}
	o.outcomes[outcome]++
}

func (o *observed) outcome(name string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.outcomes[name]
}

func (o *observed) attempt(name string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.attempts[name]
}

// providerBench is idem serve --provider in a test: the service behind the
// middleware, and the executor that reconciles, on one database.
type providerBench struct {
	t     *testing.T
	srv   *httptest.Server
	svc   *ProviderService
	exec  *idem.Executor
	store idemstore.StepStore
	obs   *observed
}

// newProviderBench serves the provider flow on a fresh database of the
// named backend ("SQLite" or "PostgreSQL"), charging at fp within budget.
func newProviderBench(t *testing.T, backend string, fp *fakeProvider, budget time.Duration) *providerBench {
	t.Helper()
	ctx := context.Background()
	var (
		store idemstore.Store
		repo  StepRepo
	)
	switch backend {
	case "SQLite":
		s := openSQLite(t)
		r := SQLiteRepo{Store: s}
		if err := r.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		store, repo = s, r
	case "PostgreSQL":
		pool, schema := pgSchema(t)
		s, err := pgstore.New(ctx, pool, &pgstore.Config{Schema: schema})
		if err != nil {
			t.Fatal(err)
		}
		r := PostgresRepo{Pool: pool}
		if err := r.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		store, repo = s, r
	default:
		t.Fatalf("unknown backend %q", backend)
	}
	secret, err := repo.MigrateSteps(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cfg := &idem.Config{TenantFunc: Tenant, FingerprintFunc: Fingerprint, MaxRequestBody: MaxBody, DeriveKeySecret: secret}
	mw, err := idem.NewMiddleware(store, cfg)
	if err != nil {
		t.Fatal(err)
	}
	exec, err := idem.NewExecutor(store, &idem.Config{DeriveKeySecret: secret})
	if err != nil {
		t.Fatal(err)
	}
	obs := &observed{}
	svc := &ProviderService{Repo: repo, URL: fp.URL, Budget: budget, Observer: obs}
	mux := http.NewServeMux()
	mux.Handle("POST /api/payments", mw.Handle(http.HandlerFunc(svc.Create)))
	mux.HandleFunc("GET /api/payments/{id}", svc.GetStep)
	mux.HandleFunc("GET /api/payments/count", svc.Count)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	t.Cleanup(func() {
		// The service's default clients keep idle connections to fp.
		for _, c := range []*http.Client{svc.Client, svc.ReconcileClient} {
			if c != nil {
				c.CloseIdleConnections()
			}
		}
	})
	svc.Client, _ = NewProviderClient(DefaultRequestAttempts)
	svc.ReconcileClient, _ = NewProviderClient(DefaultReconcileAttempts)
	return &providerBench{t: t, srv: srv, svc: svc, exec: exec, store: store.(idemstore.StepStore), obs: obs}
}

func (b *providerBench) pay(key, ref string) result {
	b.t.Helper()
	return post(b.t, b.srv.URL+"/api/payments", "application/json", key,
		fmt.Sprintf(`{"amountCents":2599,"currency":"USD","reference":%q}`, ref))
}

func (b *providerBench) get(id string) StepPayment {
	b.t.Helper()
	resp, err := http.Get(b.srv.URL + "/api/payments/" + id)
	if err != nil {
		b.t.Fatal(err)
	}
	defer resp.Body.Close()
	var p StepPayment
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&p) != nil {
		b.t.Fatalf("GET payment %s: %d", id, resp.StatusCode)
	}
	return p
}

func (b *providerBench) counts() StepCounts {
	b.t.Helper()
	resp, err := http.Get(b.srv.URL + "/api/payments/count")
	if err != nil {
		b.t.Fatal(err)
	}
	defer resp.Body.Close()
	var c struct{ Count, Captured, Failed int64 }
	if err := json.NewDecoder(resp.Body).Decode(&c); err != nil {
		b.t.Fatal(err)
	}
	return StepCounts{All: c.Count, Captured: c.Captured, Failed: c.Failed}
}

// reconcile runs one reconciliation pass that resumes what it finds. A
// pass that found a record but skipped it as in flight is run again:
// sqlitestore answers a take-over "in flight" when its write lock stays
// busy for 100 ms, which a loaded machine can cause, and the next pass
// then resumes it.
func (b *providerBench) reconcile(p idem.ReconcileParams) idem.ReconcileResult {
	b.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		rr, _ := b.exec.Reconcile(context.Background(), p, b.svc.Resume)
		if rr.Found == 0 || rr.Completed+rr.Failed > 0 || time.Now().After(deadline) {
			return rr
		}
	}
}

// stuckSteps returns the recorded steps of the one stuck record.
func (b *providerBench) stuckSteps() []idem.StepState {
	b.t.Helper()
	recs, err := b.store.Stuck(context.Background(), idemstore.StuckParams{Limit: 10, Now: time.Now()})
	if err != nil || len(recs) != 1 {
		b.t.Fatalf("Stuck = %d records, %v; want 1", len(recs), err)
	}
	steps, err := idem.ParseCheckpoint(recs[0].Checkpoint)
	if err != nil {
		b.t.Fatal(err)
	}
	return steps
}

type declinedProblem struct {
	Status         int    `json:"status"`
	Code           string `json:"code"`
	Detail         string `json:"detail"`
	PaymentID      string `json:"paymentId"`
	ProviderStatus int    `json:"providerStatus"`
	ProviderCode   string `json:"providerCode"`
}

// A provider's decline is final: the client gets a stored 402
// payment.declined that every retry replays, the provider is asked once,
// the payment is failed with the provider's reason, and the reconciler
// never charges it again; a retry after the record is gone answers from
// the failed payment without asking the provider.
func TestProviderDeclineIsFinal(t *testing.T) {
	t.Parallel()
	for _, backend := range []string{"SQLite", "PostgreSQL"} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			fp := newFakeProvider(t, answerWith(http.StatusPaymentRequired, cardDeclined))
			b := newProviderBench(t, backend, fp, 300*time.Millisecond)
			first := b.pay("declined-1", "order-1")
			var p declinedProblem
			if first.status != http.StatusPaymentRequired || json.Unmarshal([]byte(first.body), &p) != nil ||
				p.Code != CodeDeclined || p.ProviderCode != "card_declined" || p.ProviderStatus != 402 ||
				!strings.Contains(p.Detail, "Insufficient funds") || p.PaymentID == "" ||
				first.header.Get("Content-Type") != "application/problem+json" || first.header.Get("Retry-After") != "" {
				t.Fatalf("declined payment: %d %v %s, want 402 payment.declined with the provider's reason", first.status, first.header, first.body)
			}
			for i := range 3 {
				again := b.pay("declined-1", "order-1")
				if again.status != first.status || again.body != first.body || again.header.Get(idem.HeaderReplayed) != "true" {
					t.Fatalf("retry %d: %d %s (replayed %q), want the stored 402", i+1, again.status, again.body, again.header.Get(idem.HeaderReplayed))
				}
			}
			for range 3 {
				if rr := b.reconcile(idem.ReconcileParams{}); rr.Found != 0 {
					t.Fatalf("Reconcile found %d, want nothing to reconcile", rr.Found)
				}
			}
			if n := fp.calls.Load(); n != 1 {
				t.Errorf("the provider was asked %d times, want once", n)
			}
			got := b.get(p.PaymentID)
			if got.Status != StatusFailed || got.FailureCode != "card_declined" || got.FailureReason != "Insufficient funds." || got.ChargeID != "" {
				t.Errorf("GET payment = %+v, want failed with card_declined and the provider's reason", got)
			}
			if c := b.counts(); c != (StepCounts{All: 1, Failed: 1}) {
				t.Errorf("counts = %+v, want one failed payment", c)
			}
			if b.obs.attempt(AnswerDeclined) != 1 || b.obs.outcome(OutcomeDeclined) != 1 || b.obs.retries != 0 {
				t.Errorf("observed attempts %v, outcomes %v, retries %d", b.obs.attempts, b.obs.outcomes, b.obs.retries)
			}
			// The record gone (expired, or deleted by an operator), the
			// key is new again: the payment's row answers, not the
			// provider.
			scope := idem.Scope("anonymous", "POST /api/payments")
			if err := b.store.(idemstore.Inspector).Delete(context.Background(), idemstore.DeleteParams{Scope: scope, Key: "declined-1", Now: time.Now()}); err != nil {
				t.Fatal(err)
			}
			late := b.pay("declined-1", "order-1")
			if late.status != http.StatusPaymentRequired || late.code() != CodeDeclined || late.header.Get(idem.HeaderReplayed) != "false" {
				t.Errorf("retry after the record was deleted: %d %s, want a new 402 payment.declined", late.status, late.body)
			}
			if n := fp.calls.Load(); n != 1 {
				t.Errorf("after the record was deleted, the provider was asked %d times, want once", n)
			}
		})
	}
}

// Every class of provider answer (answer.go), then the same payment
// recovering once the provider answers 201: the charge it makes carries
// the key every earlier attempt carried.
func TestProviderAnswerClasses(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name   string
		answer http.HandlerFunc
		// status and code the client gets; unknown: the charge step is
		// recorded as unknown; retried: the step retried within its
		// budget.
		status           int
		code             string
		providerStatus   int
		providerCode     string
		unknown, retried bool
	}{
		{name: "402", answer: answerWith(402, cardDeclined), status: 402, code: CodeDeclined, providerStatus: 402, providerCode: "card_declined"},
		{name: "400", answer: answerWith(400, `{"code":"charge.invalid","title":"Invalid","detail":"currency is not supported"}`),
			status: 402, code: CodeDeclined, providerStatus: 400, providerCode: "charge.invalid"},
		{name: "404 without a body", answer: answerWith(404, ""), status: 402, code: CodeDeclined, providerStatus: 404, providerCode: "http_404"},
		{name: "422 with a hostile code", answer: answerWith(422, `{"code":"x\u001b]52;c;bad","detail":"\u001b[31mno\u0007"}`),
			status: 402, code: CodeDeclined, providerStatus: 422, providerCode: "http_422"},
		{name: "200 with a charge id", answer: answerWith(200, `{"id":"ch_1"}`), status: 201},
		{name: "200 without a charge id", answer: answerWith(200, `{"ok":true}`), status: 503, code: CodeStepIncomplete, unknown: true},
		{name: "202 accepted", answer: answerWith(202, `{"id":"ch_1"}`), status: 503, code: CodeStepIncomplete, unknown: true},
		{name: "201 without a charge id", answer: answerWith(201, `{"status":"ok"}`), status: 503, code: CodeStepIncomplete, unknown: true},
		{name: "201 not JSON", answer: answerWith(201, `<html>ok</html>`), status: 503, code: CodeStepIncomplete, unknown: true},
		{name: "302 without a location", answer: answerWith(302, ""), status: 503, code: CodeStepIncomplete, unknown: true},
		{name: "500", answer: answerWith(500, `{}`), status: 503, code: CodeStepIncomplete, retried: true},
		{name: "503", answer: answerWith(503, `{}`), status: 503, code: CodeStepIncomplete, retried: true},
		{name: "429", answer: answerWith(429, `{}`), status: 503, code: CodeStepIncomplete, retried: true},
		{name: "409 without Retry-After", answer: answerWith(409, `{}`), status: 503, code: CodeStepIncomplete, retried: true},
		{name: "408", answer: answerWith(408, `{}`), status: 503, code: CodeStepIncomplete, retried: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			fp := newFakeProvider(t, c.answer)
			b := newProviderBench(t, "SQLite", fp, 300*time.Millisecond)
			r := b.pay("k", "order-k")
			if r.status != c.status || r.code() != c.code {
				t.Fatalf("answer %d %s, want %d %s", r.status, r.body, c.status, c.code)
			}
			if calls := fp.calls.Load(); (calls > 1) != c.retried {
				t.Errorf("the provider was asked %d times; retried within the budget: %v, want %v", calls, calls > 1, c.retried)
			}
			if c.status == http.StatusPaymentRequired {
				var p declinedProblem
				_ = json.Unmarshal([]byte(r.body), &p)
				if p.ProviderStatus != c.providerStatus || p.ProviderCode != c.providerCode || strings.ContainsFunc(p.Detail, func(r rune) bool { return r < 0x20 }) {
					t.Errorf("problem %+v, want provider status %d and code %q, printable", p, c.providerStatus, c.providerCode)
				}
				if rr := b.reconcile(idem.ReconcileParams{}); rr.Found != 0 {
					t.Errorf("a declined payment is reconciled: %+v", rr)
				}
				return
			}
			if c.status == http.StatusCreated {
				if !strings.Contains(r.body, `"chargeId":"ch_1"`) {
					t.Errorf("captured payment %s, want charge id ch_1", r.body)
				}
				if rr := b.reconcile(idem.ReconcileParams{}); rr.Found != 0 {
					t.Errorf("a captured payment is reconciled: %+v", rr)
				}
				return
			}
			// The charge step is recorded unknown after an unexpected
			// answer. Retried answers leave it pending, or unknown when
			// the budget ended while an attempt was waiting for its
			// answer (a request in flight may have charged).
			steps := b.stuckSteps()
			unknown := len(steps) == 2 && steps[1].Name == stepCharge && steps[1].Unknown
			if len(steps) == 0 || steps[0].Name != stepPayment || !steps[0].Done || len(steps) > 2 || (c.unknown && !unknown) {
				t.Errorf("recorded steps %+v; want the payment step done and the charge step unknown: %v", steps, c.unknown)
			}
			want := OutcomeIncomplete
			if unknown {
				want = OutcomeUnknown
			}
			if b.obs.outcome(want) != 1 || len(b.obs.outcomes) != 1 {
				t.Errorf("outcomes %v, want %s", b.obs.outcomes, want)
			}
			if c.retried != (b.obs.retries > 0) {
				t.Errorf("%d retries observed; retried: want %v", b.obs.retries, c.retried)
			}
			// The provider recovers: the reconciler captures the payment
			// with the same key as every earlier attempt.
			fp.set(answerWith(201, `{"id":"ch_recovered"}`))
			if rr := b.reconcile(idem.ReconcileParams{}); rr.Completed != 1 {
				t.Fatalf("Reconcile = %+v, want the payment completed", rr)
			}
			replay := b.pay("k", "order-k")
			var p StepPayment
			if replay.status != http.StatusCreated || json.Unmarshal([]byte(replay.body), &p) != nil ||
				p.Status != StatusCaptured || p.ChargeID != "ch_recovered" || replay.header.Get(idem.HeaderReplayed) != "true" {
				t.Fatalf("after recovery: %d %s, want the captured payment replayed", replay.status, replay.body)
			}
			if n := fp.distinctKeys(); n != 1 {
				t.Errorf("the provider saw %d keys, want 1", n)
			}
		})
	}
}

// The reconciler makes one short round per payment and pass: a provider
// that keeps answering 503 costs it a few quick attempts, not the whole
// budget; a payment resumed in vain reaches MaxAttempts and is held.
func TestProviderReconcileRoundAndHold(t *testing.T) {
	t.Parallel()
	fp := newFakeProvider(t, answerWith(503, `{}`))
	b := newProviderBench(t, "SQLite", fp, 2*time.Second)
	if r := b.pay("k", "order-k"); r.status != 503 {
		t.Fatalf("client attempt: %d %s, want 503", r.status, r.body)
	}
	before := fp.calls.Load()
	start := time.Now()
	rr := b.reconcile(idem.ReconcileParams{MaxAttempts: 3})
	if rr.Found != 1 || rr.Failed != 1 || rr.Held != 0 {
		t.Fatalf("Reconcile = %+v, want one resumed in vain", rr)
	}
	// A whole budget would be 2 s of 503s: dozens of attempts.
	if d, calls := time.Since(start), fp.calls.Load()-before; calls > DefaultReconcileAttempts || d >= 2*time.Second {
		t.Errorf("one reconciliation pass asked the provider %d times in %v, want at most %d, well within the budget", calls, d, DefaultReconcileAttempts)
	}
	if rr := b.reconcile(idem.ReconcileParams{MaxAttempts: 3}); rr.Held != 1 {
		t.Fatalf("third attempt: %+v, want held", rr)
	}
	calls := fp.calls.Load()
	if rr := b.reconcile(idem.ReconcileParams{MaxAttempts: 3}); rr.Found != 0 || fp.calls.Load() != calls {
		t.Fatalf("after holding: %+v, %d more provider calls; want nothing", rr, fp.calls.Load()-calls)
	}
	held, err := b.store.Stuck(context.Background(), idemstore.StuckParams{Limit: 10, Held: true, Now: time.Now()})
	if err != nil || len(held) != 1 {
		t.Fatalf("held records = %d, %v; want 1", len(held), err)
	}
}

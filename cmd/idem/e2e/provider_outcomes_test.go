package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// count returns how many times s occurs in the output.
func (l *serverLog) count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return bytes.Count(l.buf.Bytes(), []byte(s))
}

// declined is the 402 payment.declined problem of idem serve --provider.
type declined struct {
	Status         int    `json:"status"`
	Code           string `json:"code"`
	Detail         string `json:"detail"`
	PaymentID      string `json:"paymentId"`
	ProviderStatus int    `json:"providerStatus"`
	ProviderCode   string `json:"providerCode"`
}

type failedPayment struct {
	stepPayment
	FailureCode   string `json:"failureCode"`
	FailureReason string `json:"failureReason"`
}

// A provider that declines: the client gets 402 payment.declined, the same
// bytes on every retry (through a SIGKILL and restart too); the provider
// was asked once; the payment is failed with the provider's reason; the
// reconciler never sends the charge again.
func TestProviderDeclineIsFinal(t *testing.T) {
	t.Parallel()
	for _, b := range serveBackends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			prov := startProvider(t, "--decline-rate", "1")
			db := b.db(t)
			args := []string{"--reconcile-interval", "100ms"}
			s := startProviderServe(t, "serve", anyPort, db, prov.url, "", args...)
			addr := s.addr
			key := "declined-" + randomName(8)
			body := paymentBody(2599, "order-"+key)
			first, err := postPayment(httpClient, s.url, key, body)
			if err != nil {
				t.Fatal(err)
			}
			var p declined
			if first.status != http.StatusPaymentRequired || first.problemCode() != "payment.declined" || json.Unmarshal(first.body, &p) != nil ||
				p.ProviderCode != "card_declined" || p.ProviderStatus != 402 || p.PaymentID == "" || first.header.Get("Retry-After") != "" {
				t.Fatalf("declined payment: %v, want 402 payment.declined from card_declined", first)
			}
			for i := range 3 {
				again, err := postPayment(httpClient, s.url, key, body)
				if err != nil || again.status != first.status || string(again.body) != string(first.body) || again.replayed() != "true" {
					t.Fatalf("retry %d: %v %v, want the stored 402 replayed", i+1, again, err)
				}
			}
			if n := s.mustMetric(t, `idem_provider_charge_outcomes_total{outcome="declined"}`); n != 1 {
				t.Errorf("declined outcomes = %v, want 1", n)
			}
			s.kill(t)
			s = startProviderServe(t, "serve-restarted", addr, db, prov.url, "", args...)
			again, err := postPayment(httpClient, s.url, key, body)
			if err != nil || again.status != first.status || string(again.body) != string(first.body) || again.replayed() != "true" {
				t.Fatalf("retry after SIGKILL and restart: %v %v, want the stored 402 replayed", again, err)
			}
			// Five reconciliation passes later, nothing was sent again.
			eventually(t, 30*time.Second, 20*time.Millisecond, "five reconciliation passes", func() (bool, error) {
				n, err := s.metric("idem_reconcile_passes_total")
				return n >= 5, err
			})
			if n := s.mustMetric(t, `idem_reconcile_operations_total{result="failed"}`) + s.mustMetric(t, `idem_reconcile_operations_total{result="completed"}`); n != 0 {
				t.Errorf("the reconciler resumed %v operations, want none", n)
			}
			if n := prov.log.count("declined the charge"); n != 1 {
				t.Errorf("the provider declined %d charges, want 1 (it was asked once)", n)
			}
			var got failedPayment
			getJSON(t, s.url+"/api/payments/"+p.PaymentID, &got)
			if got.Status != "failed" || got.FailureCode != "card_declined" || !strings.Contains(got.FailureReason, "declined") || got.ChargeID != "" {
				t.Errorf("GET payment: %+v, want failed with the provider's code and reason", got)
			}
			var pays struct{ Count, Captured, Failed int64 }
			getJSON(t, s.url+"/api/payments/count", &pays)
			var charges struct{ Count int64 }
			getJSON(t, prov.url+"/v1/charges/count", &charges)
			if pays.Count != 1 || pays.Failed != 1 || pays.Captured != 0 || charges.Count != 0 {
				t.Errorf("payments %+v, provider charges %d; want one failed payment and no charge", pays, charges.Count)
			}
		})
	}
}

// A payment whose provider stays down is held for an operator after
// --reconcile-max-attempts: idem_reconcile_held counts it, idem ls shows
// it held, the reconciler stops calling the provider, and the client's
// retry still resumes it once the provider is back.
func TestProviderHeldForAnOperator(t *testing.T) {
	t.Parallel()
	provAddr, provDB := freeAddr(t), filepath.Join(t.TempDir(), "provider.db")
	db := filepath.Join(t.TempDir(), "serve.db")
	s := startProviderServe(t, "serve", "127.0.0.1:0", db, "http://"+provAddr, "",
		"--provider-budget", "300ms", "--reconcile-interval", "100ms", "--reconcile-max-attempts", "3")
	key := "held-" + randomName(8)
	body := paymentBody(990, "order-"+key)
	r, err := postPayment(httpClient, s.url, key, body)
	if err != nil || r.status != http.StatusServiceUnavailable || r.problemCode() != "idempotency.step_incomplete" {
		t.Fatalf("with the provider down: %v %v, want 503 idempotency.step_incomplete", r, err)
	}
	eventually(t, 30*time.Second, 20*time.Millisecond, "the payment is held", func() (bool, error) {
		n, err := s.metric("idem_reconcile_held")
		return n == 1, err
	})
	if !s.log.contains("held for an operator") {
		t.Error("serve did not log the hold")
	}
	code, out, errs := runBinary(t, "ls", "--store", db)
	if code != 0 || !strings.Contains(out, "held") || !strings.Contains(out, key) {
		t.Errorf("idem ls: %d %q %q, want the record shown held", code, out, errs)
	}
	code, out, _ = runBinary(t, "ls", "--store", db, "--json")
	if code != 0 || !strings.Contains(out, `"held": true`) {
		t.Errorf("idem ls --json: %d %q, want held", code, out)
	}
	// Held: the reconciler no longer tries the provider.
	attempts := func() float64 {
		var sum float64
		for _, a := range []string{"refused", "lost", "retryable", "unexpected", "created", "declined"} {
			sum += s.mustMetric(t, fmt.Sprintf(`idem_provider_charge_attempts_total{answer=%q}`, a))
		}
		return sum
	}
	before, passes := attempts(), s.mustMetric(t, "idem_reconcile_passes_total")
	eventually(t, 30*time.Second, 20*time.Millisecond, "five more passes", func() (bool, error) {
		n, err := s.metric("idem_reconcile_passes_total")
		return n >= passes+5, err
	})
	if after := attempts(); after != before {
		t.Errorf("the reconciler sent %v more attempts for a held payment, want none", after-before)
	}
	var pays struct{ Count, Captured int64 }
	getJSON(t, s.url+"/api/payments/count", &pays)
	if pays.Count != 1 || pays.Captured != 0 {
		t.Fatalf("payments %+v, want one pending", pays)
	}
	prov := startProviderAt(t, provAddr, provDB)
	r, err = postPayment(retryingClient(t), s.url, key, body)
	if err != nil {
		t.Fatal(err)
	}
	checkCharged(t, s.url, prov.url, r)
	eventually(t, 30*time.Second, 20*time.Millisecond, "nothing held any more", func() (bool, error) {
		n, err := s.metric("idem_reconcile_held")
		return n == 0, err
	})
}

// Many hopeless payments (a provider that hangs for some, answers 500 for
// others) do not hold up one that the provider can charge again: with
// --reconcile-concurrency the reconciler captures it within a pass, though
// it is the last in line.
func TestProviderHopelessPaymentsDoNotHoldUpARecoveredOne(t *testing.T) {
	t.Parallel()
	const hanging, failing = 40, 40
	var down atomic.Bool
	down.Store(true)
	var mu sync.Mutex
	charged := map[string]string{} // key -> charge id
	fake := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var c struct{ Reference string }
		if json.NewDecoder(r.Body).Decode(&c) != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		switch {
		case strings.HasPrefix(c.Reference, "hang-"):
			<-r.Context().Done() // a provider that never answers this one
			return
		case strings.HasPrefix(c.Reference, "fail-"), down.Load():
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		key := r.Header.Get("Idempotency-Key")
		mu.Lock()
		id, ok := charged[key]
		if !ok {
			id = "ch_" + randomName(10)
			charged[key] = id
		}
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%q}`, id)
	}))
	t.Cleanup(fake.Close)
	db := filepath.Join(t.TempDir(), "serve.db")
	s := startProviderServe(t, "serve", "127.0.0.1:0", db, fake.URL, "",
		"--provider-budget", "500ms", "--reconcile-interval", "300ms", "--reconcile-concurrency", "16",
		"--reconcile-max-attempts", "0", "--reconcile-max-age", "0")
	jobs := make(chan string)
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for ref := range jobs {
				if r, err := postPayment(httpClient, s.url, "key-"+ref, paymentBody(100, ref)); err != nil || r.status != http.StatusServiceUnavailable {
					t.Errorf("%s: %v %v, want 503", ref, r, err)
				}
			}
		})
	}
	for i := range hanging {
		jobs <- fmt.Sprintf("hang-%d", i)
	}
	for i := range failing {
		jobs <- fmt.Sprintf("fail-%d", i)
	}
	close(jobs)
	wg.Wait()
	if r, err := postPayment(httpClient, s.url, "key-recovered", paymentBody(100, "recovered")); err != nil || r.status != http.StatusServiceUnavailable {
		t.Fatalf("recovered: %v %v, want 503 while the provider fails it", r, err)
	}
	down.Store(false)
	start := time.Now()
	eventually(t, time.Minute, 20*time.Millisecond, "the recovered payment is captured", func() (bool, error) {
		var pays struct{ Captured int64 }
		getJSON(t, s.url+"/api/payments/count", &pays)
		return pays.Captured == 1, nil
	})
	// One at a time, the 40 hanging charges before it would take 20 s
	// (40 x 500 ms) per pass.
	took := time.Since(start)
	t.Logf("the recovered payment was captured %v after the provider came back, behind %d hanging and %d failing ones",
		took.Round(time.Millisecond), hanging, failing)
	if took > 8*time.Second {
		t.Errorf("the recovered payment waited %v behind the hopeless ones, want well under the 20 s of a sequential pass", took)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(charged) != 1 {
		t.Errorf("%d charges made, want 1", len(charged))
	}
}

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemclient"
)

// The step boundaries at which `idem serve --provider` can be made to kill
// itself (IDEM_TEST_CRASH_AT): inside the payment step before its commit;
// after the pending payment and its recovery point committed; after the
// provider charged but before the charge step was recorded; after it was
// recorded; after the capture and the stored response committed, before
// the answer is sent.
var crashPoints = []string{"payment-written", "after-payment", "after-charge", "after-charge-recorded", "after-capture"}

// serveBackends are the databases `idem serve --provider` runs on.
var serveBackends = []struct {
	name string
	db   func(t *testing.T) string // a fresh --db for the test
}{
	{"SQLite", func(t *testing.T) string { return filepath.Join(t.TempDir(), "serve.db") }},
	{"PostgreSQL", func(t *testing.T) string { return newPGDatabase(t).url }},
	{"MariaDB", func(t *testing.T) string { return newMyDatabase(t).url }},
}

// startProvider runs `idem provider` on a fresh SQLite file.
func startProvider(t *testing.T, args ...string) *server {
	t.Helper()
	return startProviderAt(t, "127.0.0.1:0", filepath.Join(t.TempDir(), "provider.db"), args...)
}

// startProviderAt runs `idem provider` at addr on db.
func startProviderAt(t *testing.T, addr, db string, args ...string) *server {
	t.Helper()
	return startIdem(t, "provider", nil, append([]string{"provider", "--addr", addr, "--log-format", "json", "--db", db}, args...)...)
}

// startProviderServe runs `idem serve --provider` on db at addr, with the
// crash hook set to crashAt (empty: none).
func startProviderServe(t *testing.T, name, addr, db, providerURL, crashAt string, args ...string) *server {
	t.Helper()
	var env []string
	if crashAt != "" {
		env = []string{"IDEM_TEST_CRASH_AT=" + crashAt}
	}
	return startIdem(t, name, env, append([]string{"serve", "--addr", addr, "--log-format", "json", "--access-log=false",
		"--db", db, "--provider", providerURL, "--lease", "1s"}, args...)...)
}

// expectCrash waits for a process that kills itself.
func (s *server) expectCrash(t *testing.T) {
	t.Helper()
	s.killed = true
	select {
	case <-s.exited:
	case <-time.After(startTimeout):
		t.Fatalf("%s did not crash; log:\n%s", s.name, s.log.tail(20))
	}
}

// anyPort is the address a server is first started at: the system picks
// the port, which the server logs (server.addr). A restarted server is
// started at the address its first run logged, so that its clients' URL
// stays the same. (Picking a port with freeAddr before the first start
// raced with other tests' listeners: the port could be taken before the
// child bound it.)
const anyPort = "127.0.0.1:0"

// freeAddr returns a loopback address with a port that was free a moment
// ago, for an address that nothing listens at yet (a provider started
// later in the test, or never).
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// retryingClient is an idemclient client that keeps retrying through
// restarts and 503s for up to a minute.
func retryingClient(t *testing.T) *http.Client {
	t.Helper()
	c, err := idemclient.NewClient(&idemclient.Config{MaxAttempts: 1000, MaxElapsed: time.Minute,
		BackoffBase: 20 * time.Millisecond, BackoffCap: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	c.Timeout = 90 * time.Second
	return c
}

// postPayment POSTs a payment with key through c.
func postPayment(c *http.Client, baseURL, key, body string) (reply, error) {
	req, err := http.NewRequest(http.MethodPost, baseURL+"/api/payments", strings.NewReader(body))
	if err != nil {
		return reply{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(idem.HeaderKey, idem.FormatKey(key))
	resp, err := c.Do(req)
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return reply{}, err
	}
	return reply{status: resp.StatusCode, header: resp.Header, body: b}, nil
}

// getJSON GETs url into v.
func getJSON(t *testing.T, url string, v any) {
	t.Helper()
	resp, err := httpClient.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || json.Unmarshal(b, v) != nil {
		t.Fatalf("GET %s: %d %s", url, resp.StatusCode, b)
	}
}

type providerCharge struct {
	ID          string `json:"id"`
	AmountCents int64  `json:"amountCents"`
	Currency    string `json:"currency"`
	Reference   string `json:"reference"`
}

type stepPayment struct {
	ID          string `json:"id"`
	AmountCents int64  `json:"amountCents"`
	Reference   string `json:"reference"`
	Status      string `json:"status"`
	ChargeID    string `json:"chargeId"`
	ProviderKey string `json:"providerKey"`
}

// checkCharged checks that the payment in a 201 answer is captured with a
// charge that the provider holds, alone, under its reference.
func checkCharged(t *testing.T, serveURL, providerURL string, r reply) {
	t.Helper()
	var p stepPayment
	if r.status != http.StatusCreated || json.Unmarshal(r.body, &p) != nil {
		t.Fatalf("answer %d %s, want 201 with a payment", r.status, r.body)
	}
	if p.Status != "captured" || p.ChargeID == "" {
		t.Errorf("answer: status %q chargeId %q, want captured with a charge", p.Status, p.ChargeID)
	}
	var got stepPayment
	getJSON(t, serveURL+"/api/payments/"+p.ID, &got)
	if got.Status != "captured" || got.ChargeID != p.ChargeID || !strings.HasPrefix(got.ProviderKey, "idem-") {
		t.Errorf("GET payment: %+v, want captured with charge %s and a derived provider key", got, p.ChargeID)
	}
	var list struct{ Charges []providerCharge }
	getJSON(t, providerURL+"/v1/charges?reference="+p.Reference, &list)
	if len(list.Charges) != 1 || list.Charges[0].ID != p.ChargeID || list.Charges[0].AmountCents != p.AmountCents {
		t.Errorf("provider charges for %s: %+v, want exactly charge %s", p.Reference, list.Charges, p.ChargeID)
	}
}

// For each step boundary, serve dies by SIGKILL there; restarted, it gets
// the client's retry: exactly one charge, one captured payment, and every
// answer the client got for the key is the same.
func TestProviderCrashAtEveryStepBoundary(t *testing.T) {
	t.Parallel()
	for _, b := range serveBackends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			for _, point := range crashPoints {
				t.Run(point, func(t *testing.T) {
					t.Parallel()
					prov := startProvider(t)
					db := b.db(t)
					doomed := startProviderServe(t, "serve-"+point, anyPort, db, prov.url, point, "--reconcile-interval", "0")
					key := "crash-" + randomName(8)
					body := paymentBody(4200, "order-"+key)
					if r, err := postPayment(httpClient, doomed.url, key, body); err == nil {
						t.Fatalf("the request crossing %s got an answer: %d %s", point, r.status, r.body)
					}
					doomed.expectCrash(t)

					again := startProviderServe(t, "serve-restarted", doomed.addr, db, prov.url, "", "--reconcile-interval", "0")
					client := retryingClient(t)
					first, err := postPayment(client, again.url, key, body)
					if err != nil {
						t.Fatal(err)
					}
					checkCharged(t, again.url, prov.url, first)
					second, err := postPayment(client, again.url, key, body)
					if err != nil {
						t.Fatal(err)
					}
					if second.status != first.status || !bytes.Equal(second.body, first.body) || second.replayed() != "true" {
						t.Errorf("retry: %d %s (replayed %s), want the same answer replayed: %d %s", second.status, second.body, second.replayed(), first.status, first.body)
					}
					var count struct{ Count int64 }
					getJSON(t, prov.url+"/v1/charges/count", &count)
					var pays struct{ Count, Captured int64 }
					getJSON(t, again.url+"/api/payments/count", &pays)
					if count.Count != 1 || pays.Count != 1 || pays.Captured != 1 {
						t.Errorf("after a crash at %s: %d charges, %d payments, %d captured; want 1, 1, 1", point, count.Count, pays.Count, pays.Captured)
					}
				})
			}
		})
	}
}

// Under a provider that fails 30% of charges and drops the answer of 30%,
// 200 payments sent through idemclient with retries, with serve killed
// (SIGKILL) and restarted twice during the run, end with exactly 200
// charges and 200 captured payments, each chargeId a provider charge with
// the payment's reference.
func TestProviderFaultsAndKillsExactlyOnce(t *testing.T) {
	t.Parallel()
	for _, b := range serveBackends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			faultsAndKills(t, b.db(t))
		})
	}
}

func faultsAndKills(t *testing.T, db string) {
	const payments, workers = 200, 8
	prov := startProvider(t, "--fail-rate", "0.3", "--drop-rate", "0.3", "--delay", "0")
	serveArgs := []string{"--reconcile-interval", "1s", "--provider-budget", "2s"}
	cur := startProviderServe(t, "serve-0", anyPort, db, prov.url, "", serveArgs...)
	addr, url := cur.addr, cur.url

	client := retryingClient(t)
	var done atomic.Int64
	answers := make([]reply, payments)
	errs := make(chan error, payments)
	jobs := make(chan int)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i := range jobs {
				key := fmt.Sprintf("chaos-%d-%s", i, randomName(4))
				r, err := postPayment(client, url, key, paymentBody(100+i, "ref-"+key))
				if err == nil && r.status != http.StatusCreated {
					err = fmt.Errorf("payment %d: %d %s", i, r.status, r.body)
				}
				if err != nil {
					errs <- err
				}
				answers[i] = r
				done.Add(1)
			}
		})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	go func() {
		defer close(jobs)
		for i := range payments {
			select {
			case jobs <- i:
			case <-ctx.Done():
				return
			}
		}
	}()
	// Two SIGKILLs, at a third and at two thirds of the run.
	for n, at := range []int64{payments / 3, 2 * payments / 3} {
		eventually(t, time.Minute, 10*time.Millisecond, fmt.Sprintf("%d payments done", at), func() (bool, error) {
			return done.Load() >= at, nil
		})
		cur.kill(t)
		cur = startProviderServe(t, fmt.Sprintf("serve-%d", n+1), addr, db, prov.url, "", serveArgs...)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		return
	}
	var count struct{ Count int64 }
	getJSON(t, prov.url+"/v1/charges/count", &count)
	var pays struct{ Count, Captured int64 }
	getJSON(t, cur.url+"/api/payments/count", &pays)
	if count.Count != payments || pays.Count != payments || pays.Captured != payments {
		t.Errorf("%d charges, %d payments, %d captured; want %d each", count.Count, pays.Count, pays.Captured, payments)
	}
	// Every client has its 201, so every payment is complete by now: no
	// wait is needed. Checking each one names the payment a count misses.
	for _, r := range answers {
		checkCharged(t, cur.url, prov.url, r)
	}
}

// A provider that is down: the client gets 503 idempotency.step_incomplete
// with Retry-After and the payment stays pending; once the provider is back,
// the reconciler completes the payment without any retry, and the client's
// retry then replays the captured payment.
func TestProviderDownThenReconciled(t *testing.T) {
	t.Parallel()
	provAddr, provDB := freeAddr(t), filepath.Join(t.TempDir(), "provider.db")
	db := filepath.Join(t.TempDir(), "serve.db")
	s := startProviderServe(t, "serve", "127.0.0.1:0", db, "http://"+provAddr, "",
		"--provider-budget", "500ms", "--reconcile-interval", "200ms")
	key := "down-" + randomName(8)
	body := paymentBody(990, "order-"+key)
	r, err := postPayment(httpClient, s.url, key, body)
	if err != nil {
		t.Fatal(err)
	}
	if r.status != http.StatusServiceUnavailable || r.problemCode() != "idempotency.step_incomplete" ||
		r.header.Get("Retry-After") == "" || r.header.Get("Content-Type") != "application/problem+json" {
		t.Fatalf("with the provider down: %v, want 503 idempotency.step_incomplete with Retry-After", r)
	}
	var pays struct{ Count, Captured int64 }
	getJSON(t, s.url+"/api/payments/count", &pays)
	if pays.Count != 1 || pays.Captured != 0 {
		t.Fatalf("payments %+v, want one pending", pays)
	}

	prov := startProviderAt(t, provAddr, provDB)
	eventually(t, 30*time.Second, 50*time.Millisecond, "the reconciler captures the payment", func() (bool, error) {
		getJSON(t, s.url+"/api/payments/count", &pays)
		return pays.Captured == 1, nil
	})
	if !s.log.contains("reconciled pending payments") {
		t.Error("serve did not log the reconciliation")
	}
	r, err = postPayment(httpClient, s.url, key, body)
	if err != nil {
		t.Fatal(err)
	}
	if r.replayed() != "true" {
		t.Errorf("the retry after reconciliation was not a replay: %v", r)
	}
	checkCharged(t, s.url, prov.url, r)
}

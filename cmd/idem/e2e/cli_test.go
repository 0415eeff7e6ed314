package e2e

import (
	"bytes"
	"github.com/idemhq/idem"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// runBinary runs idem with args to its end (bounded) and returns its exit
// status, stdout and stderr.
func runBinary(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	cmd := exec.Command(binary(t), args...)
	cmd.Dir = t.TempDir() // a file the command might create stays there
	var out, errs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errs
	killWithParent(cmd)
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("idem %v did not end", args)
	}
	return cmd.ProcessState.ExitCode(), out.String(), errs.String()
}

// The binary's answers to wrong flags and values: a clear message on
// stderr and status 2, nothing started; --help on stdout with status 0.
func TestBinaryFlagErrors(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"serve", "--ttl", "-1"}, `"-1" has no unit`},
		{[]string{"serve", "--ttl", "2562047h47m16s"}, "longer than the maximum"},
		{[]string{"proxy", "--upstream", "http://127.0.0.1:9", "--ttl", "2562047h47m16s"}, "longer than the maximum"},
		{[]string{"serve", "--store", "localhost:6379"}, "is a server address, not a file"},
		{[]string{"serve", "--db", "mongodb://x"}, `is not a store idem knows (scheme "mongodb")`},
		{[]string{"proxy", "--upstream", "http://127.0.0.1:9", "--store", "mongodb://x"}, "postgres://"},
		{[]string{"proxy", "--upstream", "http://127.0.0.1:9", "--store", "mysql://x"}, "mysql://USER[:PASS]@HOST[:PORT]/DB"},
		{[]string{"serve", "--db", "mysql://root@h"}, "mysql://USER[:PASS]@HOST[:PORT]/DB"},
	} {
		code, out, errs := runBinary(t, c.args...)
		if code != 2 || !strings.Contains(errs, c.want) || strings.Contains(errs, "Usage:") || out != "" {
			t.Errorf("idem %q: status %d, stdout %q, stderr %q; want 2 and %q", c.args, code, out, errs, c.want)
		}
	}
	for _, cmd := range []string{"serve", "proxy", "check"} {
		code, out, errs := runBinary(t, cmd, "--help")
		if code != 0 || !strings.Contains(out, "Usage: idem "+cmd) || errs != "" {
			t.Errorf("idem %s --help: status %d, %d bytes on stdout, stderr %q", cmd, code, len(out), errs)
		}
	}
}

// The single-instance contract on every database `idem serve` runs on:
// the demo refuses, before claiming the key, a body not declared JSON
// (415), a reference with a control character (400) and a request without
// a key (400); the same key then works, its replay carries the same
// Idempotency-Key-Expires-At, and the key with another payload is 422.
func TestDemoRefusesBadRequests(t *testing.T) {
	t.Parallel()
	for _, b := range serveBackends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			testDemoContract(t, startServer(t, "refuse-"+b.name, "--db", b.db(t)))
		})
	}
}

func testDemoContract(t *testing.T, s *server) {
	key := "refused-" + randomName(8)
	body := paymentBody(100, "order-"+key)
	req, err := http.NewRequest(http.MethodPost, s.url+"/api/payments", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "text/plain")
	req.Header.Set("Idempotency-Key", key)
	resp, err := httpClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	drain(resp)
	if resp.StatusCode != http.StatusUnsupportedMediaType {
		t.Errorf("text/plain: %d, want 415", resp.StatusCode)
	}
	if r := mustPay(t, s, key, `{"amountCents":100,"currency":"USD","reference":"a\u0000b"}`); r.status != http.StatusBadRequest || r.problemCode() != "payment.invalid" {
		t.Errorf("NUL in reference: %v, want 400 payment.invalid", r)
	}
	req, err = http.NewRequest(http.MethodPost, s.url+"/api/payments", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err = httpClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	drain(resp)
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("no Idempotency-Key: %d, want 400", resp.StatusCode)
	}
	first := mustPay(t, s, key, body)
	if first.status != http.StatusCreated {
		t.Fatalf("the same key after the refusals: %v", first)
	}
	replay := mustPay(t, s, key, body)
	checkReplay(t, first, replay)
	if exp := first.header.Get(idem.HeaderExpiresAt); exp == "" || replay.header.Get(idem.HeaderExpiresAt) != exp {
		t.Errorf("%s: %q first, %q on the replay", idem.HeaderExpiresAt, exp, replay.header.Get(idem.HeaderExpiresAt))
	}
	if r := mustPay(t, s, key, paymentBody(101, "order-"+key)); r.status != http.StatusUnprocessableEntity || r.problemCode() != idem.CodeKeyReused {
		t.Errorf("same key, other payload: %v", r)
	}
}

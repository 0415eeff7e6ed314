package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// chromiumPath is Debian's chromium, which .ci/run installs.
const chromiumPath = "/usr/bin/chromium"

// browserTools returns the node binary and the browser driver's
// directory, skipping the test when they are missing outside CI and
// failing it in CI (.ci/run installs chromium, node and the npm packages).
func browserTools(t *testing.T) (node, dir string) {
	t.Helper()
	dir, err := filepath.Abs("browser")
	if err != nil {
		t.Fatal(err)
	}
	missing := func(what string, err error) {
		t.Helper()
		if os.Getenv("CI") != "" {
			t.Fatalf("%s is missing (CI is set; .ci/run installs it): %v", what, err)
		}
		t.Skipf("%s is missing: %v", what, err)
	}
	if _, err := os.Stat(envOr("CHROMIUM", chromiumPath)); err != nil {
		missing("chromium (apt-get install chromium)", err)
	}
	node, err = exec.LookPath("node")
	if err != nil {
		missing("node (apt-get install nodejs npm)", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "playwright-core")); err != nil {
		missing("playwright-core (npm ci in cmd/idem/e2e/browser)", err)
	}
	return node, dir
}

// The operator console, in a real browser: serve with a provider that
// fails makes payments that end suspended; the console (behind a token)
// finds one by key, shows its steps, reconciles it once the provider is
// back, shows it completed, deletes it after a confirmation, and refuses
// a wrong token. IDEM_CONSOLE_SCREENSHOTS=DIR writes the screenshots of
// docs/console.md there.
func TestConsoleInBrowser(t *testing.T) {
	t.Parallel()
	node, dir := browserTools(t)
	tmp := t.TempDir()
	token := "e2e-console-token-0123456789"
	tokenFile := filepath.Join(tmp, "console.token")
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	providerDB := filepath.Join(tmp, "provider.db")
	down := startProviderAt(t, anyPort, providerDB, "--fail-rate", "1")
	providerAddr := down.addr
	consoleAddr := freeAddr(t)
	srv := startProviderServe(t, "serve", "127.0.0.1:0", filepath.Join(tmp, "serve.db"), "http://"+providerAddr, "",
		"--provider-budget", "300ms", "--reconcile-interval", "0", "--console-addr", consoleAddr, "--console-token-file", tokenFile)
	keys := []string{"pay-console-1", "pay-console-2", "pay-console-3"}
	for i, key := range keys {
		r, err := postPayment(httpClient, srv.url, key, fmt.Sprintf(`{"amountCents":%d,"currency":"USD","reference":"console-%d"}`, 1000+i, i))
		if err != nil || r.status != http.StatusServiceUnavailable || !strings.Contains(string(r.body), "step_incomplete") {
			t.Fatalf("payment %s with the provider down: %d %s %v", key, r.status, r.body, err)
		}
	}
	// The provider comes back; nothing resumes the payments on its own
	// (no reconciler, no retry): the console does.
	if err := down.stop(); err != nil {
		t.Fatal(err)
	}
	down.killed = true
	startProviderAt(t, providerAddr, providerDB)
	// Some traffic for the overview's chart: a payment made, replayed
	// twice, and a reused key refused.
	for i := range 3 {
		if r, err := postPayment(httpClient, srv.url, "pay-console-ok", `{"amountCents":99,"currency":"USD","reference":"ok"}`); err != nil || r.status != http.StatusCreated {
			t.Fatalf("payment %d with the provider back: %d %s %v", i, r.status, r.body, err)
		}
	}
	if r, err := postPayment(httpClient, srv.url, keys[1], `{"amountCents":1,"currency":"USD","reference":"other"}`); err != nil || r.status != http.StatusUnprocessableEntity {
		t.Fatalf("a reused key: %d %s %v", r.status, r.body, err)
	}
	// A client's key holding markup: the console must show it as text.
	const markupKey = `<script>alert(1)</script>`
	if r, err := postPayment(httpClient, srv.url, markupKey, `{"amountCents":77,"currency":"USD","reference":"markup"}`); err != nil || r.status != http.StatusCreated {
		t.Fatalf("the payment with a markup key: %d %s %v", r.status, r.body, err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "console.mjs")
	cmd.Dir, cmd.Env = dir, append(os.Environ(), "CONSOLE_URL=http://"+consoleAddr, "CONSOLE_TOKEN="+token, "SUSPENDED_KEY="+keys[0], "MARKUP_KEY="+markupKey,
		"SCREENSHOT_DIR="+os.Getenv("IDEM_CONSOLE_SCREENSHOTS"))
	cmd.WaitDelay = 5 * time.Second
	began := time.Now()
	out, err := cmd.CombinedOutput()
	t.Logf("browser (%v):\n%s", time.Since(began).Round(time.Millisecond), out)
	if err != nil {
		t.Fatalf("the browser test failed: %v", err)
	}
	// The console's actions are in serve's log, the key redacted.
	for _, want := range []string{`"action":"reconcile"`, `"action":"delete"`, `"result":"done"`, "wrong token"} {
		srv.log.waitLine(t, 10*time.Second, want)
	}
	if srv.log.contains(`"key":"` + keys[0] + `"`) {
		t.Errorf("serve's log holds the key %s in clear", keys[0])
	}
	if srv.log.contains(`\u003cscript`) || srv.log.contains("<script") {
		t.Errorf("serve's log holds the markup key in clear")
	}
	// The other payments are still suspended, and the reconciled one was
	// charged once.
	var count struct{ Count, Captured int }
	getJSON(t, srv.url+"/api/payments/count", &count)
	if count.Count != 5 || count.Captured != 3 {
		t.Errorf("payments after the console's reconcile: %+v, want 5 with 3 captured", count)
	}
}

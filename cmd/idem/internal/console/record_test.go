package console

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/cmd/idem/internal/metrics"
	"github.com/idemhq/idem/idemcrypt"
	"github.com/idemhq/idem/outbox"
	"github.com/idemhq/idem/sqlitestore/sqliteoutbox"
)

// A record's page: its fields and header fields always, its body only
// with ShowBody and always escaped, steps with their derived keys.
func TestRecordPage(t *testing.T) {
	t.Parallel()
	s := openStore(t, filepath.Join(t.TempDir(), "r.db"))
	sd := seed(t, s, 1)
	plain := setup(t, s, nil)
	_, body, _ := plain.get("/records/" + plain.find(sd.scope, sd.completed[0]))
	for _, want := range []string{`id="status">201`, "X-Secret-Ish", "hdr-value", "not shown", "version v1", `id="fence">`} {
		if !strings.Contains(body, want) {
			t.Errorf("the record page lacks %q:\n%s", want, body)
		}
	}
	if strings.Contains(body, "alert(1)") {
		t.Errorf("the body is shown without ShowBody:\n%s", body)
	}
	shown := setup(t, s, func(c *Config) {
		c.ShowBody = true
		c.DeriveKeyFunc = func(scope, key, step string) string { return idem.DeriveKeyWith([]byte("secret"), scope, key, step) }
		c.StepNames = []string{"first", "second"}
	})
	_, body, _ = shown.get("/records/" + shown.find(sd.scope, sd.completed[0]))
	if !strings.Contains(body, "&lt;script&gt;alert(1)&lt;/script&gt;") || strings.Contains(body, "<script>alert") {
		t.Errorf("the body is not shown escaped:\n%s", body)
	}
	_, body, _ = shown.get("/records/" + shown.find(sd.scope, sd.susp))
	derived := idem.DeriveKeyWith([]byte("secret"), sd.scope, sd.susp, "first")
	for _, want := range []string{"suspended after a step", "<code>first</code>", "done", derived, "step-data", "<code>second</code>", "pending", `id="action-release"`} {
		if !strings.Contains(body, want) {
			t.Errorf("the suspended record's page lacks %q:\n%s", want, body)
		}
	}
	_, body, _ = plain.get("/records/" + plain.find(sd.scope, sd.susp))
	if !strings.Contains(body, "not known here") || strings.Contains(body, derived) || strings.Contains(body, "step-data") {
		t.Errorf("without the secret and ShowBody, the page shows derived keys or step data:\n%s", body)
	}
}

// An encrypted response is shown only with the keys.
func TestEncryptedRecord(t *testing.T) {
	t.Parallel()
	s := openStore(t, filepath.Join(t.TempDir(), "r.db"))
	kr, err := idemcrypt.NewKeyring(idemcrypt.Key{ID: "k1", Key: make([]byte, 32)})
	if err != nil {
		t.Fatal(err)
	}
	enc, err := idemcrypt.New(kr, nil)
	if err != nil {
		t.Fatal(err)
	}
	exec, _ := idem.NewExecutor(s.Records, &idem.Config{Encryption: enc})
	scope := idem.Scope("t", "POST /x")
	if _, err := exec.Do(context.Background(), idem.DoParams{Scope: scope, Key: "enc-key", Fingerprint: "v1:fp"}, func(context.Context) (*idem.Response, error) {
		return &idem.Response{StatusCode: 202, Body: []byte("secret body")}, nil
	}); err != nil {
		t.Fatal(err)
	}
	without := setup(t, s, func(c *Config) { c.ShowBody = true })
	_, body, _ := without.get("/records/" + without.find(scope, "enc-key"))
	if !strings.Contains(body, "--encryption-keys") || strings.Contains(body, "secret body") || strings.Contains(body, `id="status"`) {
		t.Errorf("without keys the page shows the sealed response:\n%s", body)
	}
	with := setup(t, s, func(c *Config) { c.ShowBody = true; c.Encryption = enc })
	_, body, _ = with.get("/records/" + with.find(scope, "enc-key"))
	if !strings.Contains(body, "secret body") || !strings.Contains(body, `id="status">202`) {
		t.Errorf("with keys the page does not show the response:\n%s", body)
	}
}

// The outbox: its backlog on the overview, its unsent messages, and a
// confirmed retry that frees a message's claim and wakes the dispatcher.
func TestOutbox(t *testing.T) {
	t.Parallel()
	s := openStore(t, filepath.Join(t.TempDir(), "r.db"))
	ob, err := sqliteoutbox.New(s.SQLite.DB(), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := ob.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	exec, _ := idem.NewExecutor(s.Records, nil)
	if _, err := exec.Do(ctx, idem.DoParams{Scope: "s", Key: "k", Fingerprint: "fp"}, func(ctx context.Context) (*idem.Response, error) {
		return &idem.Response{StatusCode: 200}, ob.Add(ctx, outbox.Message{ID: "m1", Topic: "t.created", Payload: []byte(`{"p":"<b>"}`)},
			outbox.Message{ID: "m2", Topic: "t.created"})
	}); err != nil {
		t.Fatal(err)
	}
	claimed, err := ob.Claim(ctx, outbox.ClaimParams{Owner: "dead-dispatcher", Limit: 1, Lease: time.Hour, Now: time.Now()})
	if err != nil || len(claimed) != 1 {
		t.Fatalf("claim: %v %v", claimed, err)
	}
	var woken atomic.Int32
	b := setup(t, s, func(c *Config) { c.RetryNowFunc = func() { woken.Add(1) }; c.ShowBody = true })
	_, body, _ := b.get("/")
	if !strings.Contains(body, "2 messages waiting") || !strings.Contains(body, "tried 1 time") {
		t.Errorf("the overview does not show the backlog:\n%s", body)
	}
	_, body, _ = b.get("/outbox")
	if !strings.Contains(body, "<code>m1</code>") || !strings.Contains(body, "held") || !strings.Contains(body, "&lt;b&gt;") {
		t.Errorf("the outbox page lacks m1, its claim or its escaped payload:\n%s", body)
	}
	path := fmt.Sprintf("/outbox/%d/retry", claimed[0].Seq)
	if code, _, _ := b.post(path, url.Values{csrfField: {b.csrf()}}); code != http.StatusBadRequest {
		t.Errorf("retry without confirming = %d, want 400", code)
	}
	code, page, _ := b.get(path)
	if code != http.StatusOK || !strings.Contains(page, "goes out twice") {
		t.Fatalf("the retry's confirmation = %d, without the warning about the held claim:\n%s", code, page)
	}
	code, _, h := b.post(path, url.Values{csrfField: {field(t, csrfRE, page)}, "confirm": {field(t, confirmRE, page)}})
	if code != http.StatusSeeOther || h.Get("Location") != "/outbox?done=retried" || woken.Load() != 1 {
		t.Fatalf("confirmed retry = %d to %q, dispatcher woken %d times", code, h.Get("Location"), woken.Load())
	}
	if got, err := ob.Claim(ctx, outbox.ClaimParams{Owner: "live", Limit: 10, Lease: time.Hour, Now: time.Now()}); err != nil || len(got) != 2 {
		t.Errorf("after the retry another dispatcher claims %d messages (%v), want both", len(got), err)
	}
	if !strings.Contains(b.log.String(), `action="retry outbox message"`) {
		t.Errorf("the retry was not logged:\n%s", b.log.String())
	}
	if code, _, _ := b.get("/outbox/0/retry"); code != http.StatusBadRequest {
		t.Errorf("retry of message 0 = %d, want 400", code)
	}
	if code, _, _ := b.get("/outbox/999/retry"); code != http.StatusNotFound {
		t.Errorf("retry of an unknown message = %d, want 404", code)
	}
}

// Inside serve and proxy the overview charts the process's rates.
func TestRates(t *testing.T) {
	t.Parallel()
	s := openStore(t, filepath.Join(t.TempDir(), "r.db"))
	m := metrics.New()
	m.Observe(context.Background(), idem.Event{Kind: idem.EventExecuted})
	b := setup(t, s, func(c *Config) { c.Rates = m.Rates })
	if _, body, _ := b.get("/"); !strings.Contains(body, `src="/rates.svg"`) {
		t.Errorf("the overview has no chart:\n%s", body)
	}
	code, svg, h := b.get("/rates.svg?t=1")
	if code != http.StatusOK || h.Get("Content-Type") != "image/svg+xml" || !strings.Contains(svg, "<polyline") || !strings.Contains(svg, "executions") {
		t.Errorf("GET /rates.svg = %d %q:\n%s", code, h.Get("Content-Type"), svg)
	}
	plain := setup(t, s, nil)
	if code, _, _ := plain.get("/rates.svg"); code != http.StatusNotFound {
		t.Errorf("rates outside serve and proxy = %d, want 404", code)
	}
}

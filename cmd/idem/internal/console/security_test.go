package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemstore"
)

const testToken = "correct-horse-battery-staple-42"

// With a token, every page needs it: a bearer token or the login form's
// cookie (HttpOnly, SameSite=Strict); a wrong one is refused and logged.
func TestTokenRequired(t *testing.T) {
	t.Parallel()
	s := openStore(t, filepath.Join(t.TempDir(), "r.db"))
	seed(t, s, 2)
	b := setup(t, s, func(c *Config) { c.Token = testToken })
	for _, path := range []string{"/", "/records", "/records?state=in-flight", "/records/" + strings.Repeat("a", 64)} {
		if code, body, h := b.get(path); code != http.StatusUnauthorized || !strings.Contains(body, `name="token"`) || h.Get("WWW-Authenticate") == "" {
			t.Errorf("GET %s without the token = %d (WWW-Authenticate %q), want 401 and the login form", path, code, h.Get("WWW-Authenticate"))
		}
	}
	if code, _, _ := b.get("/", "Authorization", "Bearer wrong-token-wrong-token"); code != http.StatusUnauthorized {
		t.Errorf("a wrong bearer token: %d, want 401", code)
	}
	if !strings.Contains(b.log.String(), "wrong bearer token") {
		t.Errorf("the wrong bearer token was not logged:\n%s", b.log.String())
	}
	if code, _, _ := b.get("/", "Authorization", "Bearer "+testToken); code != http.StatusOK {
		t.Errorf("the right bearer token: %d, want 200", code)
	}
	if code, _, _ := b.post("/search", url.Values{"key": {"x"}}); code != http.StatusUnauthorized {
		t.Errorf("POST without the token: %d, want 401", code)
	}
	if code, body, _ := b.post("/login", url.Values{"token": {"not-the-token-at-all"}, "next": {"/records"}}); code != http.StatusUnauthorized || !strings.Contains(body, "Wrong token") {
		t.Errorf("login with a wrong token = %d, want 401 and 'Wrong token'", code)
	}
	if code, _, _ := b.post("/login", url.Values{"token": {testToken}, "next": {"/records"}}, "Origin", "http://evil.example", "Sec-Fetch-Site", "cross-site"); code != http.StatusForbidden {
		t.Errorf("login from another site = %d, want 403", code)
	}
	code, _, h := b.post("/login", url.Values{"token": {testToken}, "next": {"//evil.example/x"}})
	if code != http.StatusSeeOther || h.Get("Location") != "/" {
		t.Fatalf("login = %d to %q, want 303 to / (an off-site next is dropped)", code, h.Get("Location"))
	}
	sc := h.Get("Set-Cookie")
	for _, attr := range []string{"HttpOnly", "SameSite=Strict", "Path=/"} {
		if !strings.Contains(sc, attr) {
			t.Errorf("the session cookie %q lacks %s", sc, attr)
		}
	}
	if strings.Contains(sc, testToken) {
		t.Errorf("the session cookie holds the token: %q", sc)
	}
	if code, _, _ := b.get("/records"); code != http.StatusOK {
		t.Errorf("GET /records after login = %d, want 200", code)
	}
	// Logging out ends the session in this browser.
	if code, _, _ := b.post("/logout", url.Values{csrfField: {b.csrf()}}); code != http.StatusSeeOther {
		t.Errorf("logout = %d, want 303", code)
	}
	if code, _, _ := b.get("/"); code != http.StatusUnauthorized {
		t.Errorf("GET / after logout = %d, want 401", code)
	}
}

// POSTs need the session's CSRF token and must come from the console's
// own origin.
func TestCSRF(t *testing.T) {
	t.Parallel()
	s := openStore(t, filepath.Join(t.TempDir(), "r.db"))
	sd := seed(t, s, 1)
	b := setup(t, s, nil)
	tok := b.csrf()
	form := url.Values{"key": {sd.completed[0]}}
	if code, _, _ := b.post("/search", form); code != http.StatusForbidden {
		t.Errorf("POST without a CSRF token = %d, want 403", code)
	}
	form.Set(csrfField, tok+"x")
	if code, _, _ := b.post("/search", form); code != http.StatusForbidden {
		t.Errorf("POST with a wrong CSRF token = %d, want 403", code)
	}
	form.Set(csrfField, tok)
	for _, h := range [][]string{
		{"Origin", "http://evil.example", "Sec-Fetch-Site", "cross-site"},
		{"Origin", "http://evil.example", "Sec-Fetch-Site", ""},
		{"Origin", "", "Sec-Fetch-Site", "same-site"},
		{"Origin", "", "Sec-Fetch-Site", ""},
	} {
		if code, _, _ := b.post("/search", form, h...); code != http.StatusForbidden {
			t.Errorf("POST with %v = %d, want 403", h, code)
		}
	}
	if code, _, h := b.post("/search", form); code != http.StatusSeeOther || !strings.HasPrefix(h.Get("Location"), "/records/") {
		t.Errorf("a same-origin search = %d to %q, want 303 to the record", code, h.Get("Location"))
	}
	// Another browser (no session) cannot post at all.
	other := setup(t, s, nil)
	other.srv.Close()
	other.srv = b.srv
	if code, _, _ := other.post("/search", form); code != http.StatusForbidden {
		t.Errorf("POST from a browser without a session = %d, want 403", code)
	}
	if !strings.Contains(b.log.String(), "a POST was refused") {
		t.Errorf("refused POSTs were not logged:\n%s", b.log.String())
	}
}

// Without a token the console answers only requests to a loopback host
// (a page whose name an attacker points at 127.0.0.1 cannot read it).
func TestLoopbackHostOnly(t *testing.T) {
	t.Parallel()
	s := openStore(t, filepath.Join(t.TempDir(), "r.db"))
	b := setup(t, s, nil)
	req, _ := http.NewRequest(http.MethodGet, b.srv.URL+"/", nil)
	req.Host = "evil.example:8089"
	if code, _, _ := b.do(req); code != http.StatusMisdirectedRequest {
		t.Errorf("Host evil.example = %d, want 421", code)
	}
	for _, host := range []string{"localhost:8089", "[::1]:8089", "127.0.0.1"} {
		req, _ := http.NewRequest(http.MethodGet, b.srv.URL+"/", nil)
		req.Host = host
		if code, _, _ := b.do(req); code != http.StatusOK {
			t.Errorf("Host %s = %d, want 200", host, code)
		}
	}
	// With a token, any host name may be used (behind a proxy).
	tb := setup(t, s, func(c *Config) { c.Token = testToken })
	req, _ = http.NewRequest(http.MethodGet, tb.srv.URL+"/", nil)
	req.Host = "console.internal"
	req.Header.Set("Authorization", "Bearer "+testToken)
	if code, _, _ := tb.do(req); code != http.StatusOK {
		t.Errorf("with a token, Host console.internal = %d, want 200", code)
	}
}

// Bad parameters are 400, with no store work.
func TestBadInput(t *testing.T) {
	t.Parallel()
	s := openStore(t, filepath.Join(t.TempDir(), "r.db"))
	b := setup(t, s, nil)
	for _, path := range []string{
		"/records?state=bogus", "/records?limit=0", "/records?limit=501", "/records?limit=x", "/records?older=abc",
		"/records?older=-5m", "/records?after=zzz", "/records?after=1." + strings.Repeat("a", 64), "/records?x=1",
		"/records?state=completed&state=in-flight", "/records?scope=" + strings.Repeat("s", 1025), "/records?after=o-1",
		"/?x=1", "/records/zzz", "/records/" + strings.Repeat("a", 63), "/outbox", "/records/" + strings.Repeat("a", 64) + "/delete?x=1",
		"/static/console.css?v=1",
	} {
		code, _, _ := b.get(path)
		want := http.StatusBadRequest
		if path == "/outbox" {
			want = http.StatusNotFound // no outbox in this store
		}
		if code != want {
			t.Errorf("GET %s = %d, want %d", path, code, want)
		}
	}
	if code, _, _ := b.get("/records/" + strings.Repeat("a", 64)); code != http.StatusNotFound {
		t.Errorf("an unknown id = %d, want 404", code)
	}
	if code, _, _ := b.get("/records/" + strings.Repeat("a", 64) + "/explode"); code != http.StatusNotFound {
		t.Errorf("an unknown action = %d, want 404", code)
	}
	tok := b.csrf()
	for _, f := range []url.Values{{"key": {""}}, {"key": {strings.Repeat("k", 1025)}}, {"key": {"\xff"}}} {
		f.Set(csrfField, tok)
		if code, _, _ := b.post("/search", f); code != http.StatusBadRequest {
			t.Errorf("search %q = %d, want 400", f.Get("key"), code)
		}
	}
	big := url.Values{csrfField: {tok}, "key": {strings.Repeat("k", maxForm)}}
	if code, _, _ := b.post("/search", big); code != http.StatusBadRequest {
		t.Errorf("a form over %d bytes = %d, want 400", maxForm, code)
	}
}

func TestLoadTokenAndCheckAddr(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, content string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	if tok, warn, err := LoadToken(write("ok", "  "+testToken+"\n", 0o600)); err != nil || tok != testToken || warn != "" {
		t.Errorf("LoadToken(ok) = %q, %q, %v", tok, warn, err)
	}
	if _, warn, err := LoadToken(write("open", testToken, 0o644)); err != nil || !strings.Contains(warn, "chmod 600") {
		t.Errorf("LoadToken of a file others can read: warning %q, %v", warn, err)
	}
	for name, content := range map[string]string{"short": "short", "space": "a token with spaces in it", "empty": "\n"} {
		if _, _, err := LoadToken(write(name, content, 0o600)); err == nil {
			t.Errorf("LoadToken(%s) accepted %q", name, content)
		}
	}
	if _, _, err := LoadToken(filepath.Join(dir, "missing")); err == nil {
		t.Error("LoadToken of a missing file succeeded")
	}
	if _, _, err := LoadToken(dir); err == nil {
		t.Error("LoadToken of a directory succeeded")
	}
	for addr, ok := range map[string]bool{"127.0.0.1:8089": true, "localhost:0": true, "[::1]:1": true, "127.1.2.3:80": true,
		"0.0.0.0:8089": false, ":8089": false, "[::]:8089": false, "10.0.0.5:8089": false, "example.com:80": false, "nonsense": false} {
		if err := CheckAddr(addr, false); (err == nil) != ok {
			t.Errorf("CheckAddr(%q, no token) = %v, want ok %v", addr, err, ok)
		}
		if err := CheckAddr(addr, true); err != nil && addr != "nonsense" {
			t.Errorf("CheckAddr(%q, token) = %v", addr, err)
		}
	}
	if err := CheckAddr("0.0.0.0:8089", false); err == nil || !strings.Contains(err.Error(), "--console-token-file") {
		t.Errorf("the refusal does not name --console-token-file: %v", err)
	}
}

// A key and a scope holding markup render inert on every page that shows
// them, and the key never reaches the log in clear, not even inside an
// error that quotes it.
func TestMarkupInKeyRendersInert(t *testing.T) {
	t.Parallel()
	s := openStore(t, filepath.Join(t.TempDir(), "r.db"))
	const key = `<script>alert("key")</script>`
	const scope = `t1 <img src=x onerror=alert(2)>`
	exec, err := idem.NewExecutor(s.Records, &idem.Config{TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := exec.Do(ctx, idem.DoParams{Scope: scope, Key: key, Fingerprint: "v1:fp"}, func(context.Context) (*idem.Response, error) {
		return &idem.Response{StatusCode: 201}, nil
	}); err != nil {
		t.Fatal(err)
	}
	b := setup(t, s, nil)
	id := b.find(scope, key)
	_, list, _ := b.get("/records")
	_, record, _ := b.get("/records/" + id)
	_, confirm, _ := b.get("/records/" + id + "/delete")
	_, missing, _ := b.post("/search", url.Values{csrfField: {b.csrf()}, "key": {key + "-other"}, "scope": {scope}})
	pages := map[string]string{"the list": list, "the record": record, "the confirmation": confirm, "a search that finds nothing": missing}
	for name, body := range pages {
		for _, raw := range []string{"<script>alert", "<img src=x"} {
			if strings.Contains(body, raw) {
				t.Errorf("%s holds %q unescaped:\n%s", name, raw, body)
			}
		}
	}
	for name, body := range map[string]string{"the list": list, "the record": record} {
		if !strings.Contains(body, "&lt;script&gt;alert(&#34;key&#34;)&lt;/script&gt;") || !strings.Contains(body, "&lt;img src=x onerror=alert(2)&gt;") {
			t.Errorf("%s does not show the key and scope escaped:\n%s", name, body)
		}
	}
	// The action's audit line names the key by its redaction only.
	if code, _ := b.act(id, "delete"); code != http.StatusOK {
		t.Fatalf("delete = %d", code)
	}
	log := b.log.String()
	if strings.Contains(log, "script") || strings.Contains(log, `alert(\"key`) {
		t.Errorf("the log holds the key in clear:\n%s", log)
	}
	if !strings.Contains(log, idem.RedactKey(key)) {
		t.Errorf("the log lacks the key's redaction %s:\n%s", idem.RedactKey(key), log)
	}
}

// redactKey replaces a key in an error's text, as it is and as %q quotes
// it, and keeps the error's identity.
func TestRedactKey(t *testing.T) {
	t.Parallel()
	const key = `k"<b>`
	base := fmt.Errorf("store: claim %q: %w; raw %s", key, idemstore.ErrNotFound, key)
	got := redactKey(base, key)
	if strings.Contains(got.Error(), "<b>") || strings.Count(got.Error(), idem.RedactKey(key)) != 2 {
		t.Errorf("redactKey = %q", got)
	}
	if !errors.Is(got, idemstore.ErrNotFound) {
		t.Errorf("redactKey lost the error's identity: %v", got)
	}
	if redactKey(nil, key) != nil || redactKey(base, "") != base || redactKey(errors.New("other"), key).Error() != "other" {
		t.Error("redactKey changed what it had nothing to redact")
	}
}

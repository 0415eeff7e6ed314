package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemhq/idem"
)

// keyringFile writes a keyring file with fresh random keys for ids (newest
// last) and returns its path; keys maps an id to its line, so that later
// files of the same test reuse the same key under the same id.
func keyringFile(t *testing.T, keys map[string]string, ids ...string) string {
	t.Helper()
	var b strings.Builder
	b.WriteString("# idem test keyring\n")
	for _, id := range ids {
		line, ok := keys[id]
		if !ok {
			k := make([]byte, 32)
			_, _ = rand.Read(k)
			line = id + ":" + base64.StdEncoding.EncodeToString(k)
			keys[id] = line
		}
		b.WriteString(line + "\n")
	}
	path := filepath.Join(t.TempDir(), "keys-"+strings.Join(ids, "-"))
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// sqliteFiles returns the bytes of a SQLite database and its write-ahead
// log.
func sqliteFiles(t *testing.T, path string) []byte {
	t.Helper()
	var all []byte
	for _, p := range []string{path, path + "-wal"} {
		b, err := os.ReadFile(p)
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		all = append(all, b...)
	}
	return all
}

// idem serve --encryption-keys: the records file (apart from the payments)
// holds no trace of the payment, replays are byte for byte, and rotation
// works across restarts: keys 1, then 1+2 (old records replay), then 2 alone
// (old records answer 503 record_unreadable and never run again; new ones
// replay).
func TestServeEncryptionKeys(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	payments, records := filepath.Join(dir, "payments.db"), filepath.Join(dir, "records.db")
	keys := map[string]string{}
	marker := "MARKER-" + randomName(8)
	oldKey, newKey := "enc-old-"+randomName(6), "enc-new-"+randomName(6)
	oldBody, newBody := paymentBody(1234, marker+"-old"), paymentBody(5678, marker+"-new")

	s1 := startServer(t, "enc-1", "--db", payments, "--store", records, "--encryption-keys", keyringFile(t, keys, "1"))
	first := mustPay(t, s1, oldKey, oldBody)
	if first.status != http.StatusCreated || !bytes.Contains(first.body, []byte(marker)) {
		t.Fatalf("first payment: %v", first)
	}
	checkReplay(t, first, mustPay(t, s1, oldKey, oldBody))
	if !s1.log.contains(`"encryption":"AES-256-GCM, keys 1, new records under 1"`) {
		t.Errorf("the start-up line does not describe the encryption; log:\n%s", s1.log.tail(5))
	}
	stopGracefully(t, s1)
	// The payment itself is business data in the payments file; the
	// stored response is in the records file, encrypted.
	if !bytes.Contains(sqliteFiles(t, payments), []byte(marker)) {
		t.Fatal("the marker is not in the payments file: the check below would prove nothing")
	}
	if raw := sqliteFiles(t, records); bytes.Contains(raw, []byte(marker)) || bytes.Contains(raw, []byte(first.paymentID(t))) {
		t.Fatal("the records file holds the payment's response in clear")
	}

	s12 := startServer(t, "enc-1+2", "--db", payments, "--store", records, "--encryption-keys", keyringFile(t, keys, "1", "2"))
	checkReplay(t, first, mustPay(t, s12, oldKey, oldBody))
	second := mustPay(t, s12, newKey, newBody)
	if second.status != http.StatusCreated {
		t.Fatalf("payment under keys 1+2: %v", second)
	}
	stopGracefully(t, s12)

	s2 := startServer(t, "enc-2", "--db", payments, "--store", records, "--encryption-keys", keyringFile(t, keys, "2"))
	for range 2 {
		r := mustPay(t, s2, oldKey, oldBody)
		if r.status != http.StatusServiceUnavailable || r.problemCode() != idem.CodeRecordUnreadable {
			t.Fatalf("record under the removed key 1: %v, want 503 %s", r, idem.CodeRecordUnreadable)
		}
	}
	checkReplay(t, second, mustPay(t, s2, newKey, newBody))
	if n := apiCount(t, s2); n != 2 {
		t.Errorf("%d payments, want 2: a record under a removed key ran again", n)
	}
	// The log line is written before the answer, but reaches the test
	// through a pipe: wait for it.
	eventually(t, 30*time.Second, 20*time.Millisecond, "the unreadable record logged", func() (bool, error) {
		return s2.log.contains("stored response cannot be decrypted"), nil
	})
}

// A malformed keyring file stops idem serve and idem proxy at start-up
// with a message naming the flag, the file and the line (never the key),
// and a non-zero exit status.
func TestEncryptionKeysMalformed(t *testing.T) {
	t.Parallel()
	good := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{7}, 32))
	short := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{7}, 16))
	dir := t.TempDir()
	cases := []struct{ name, text, want string }{
		{"short key", "1:" + good + "\n2:" + short + "\n", "line 2"},
		{"not base64", "1:@@@\n", "not valid base64"},
		{"no keys", "# empty\n", "no keys"},
		{"duplicate id", "a:" + good + "\na:" + good + "\n", "duplicate key id"},
	}
	for _, c := range cases {
		path := filepath.Join(dir, strings.ReplaceAll(c.name, " ", "-"))
		if err := os.WriteFile(path, []byte(c.text), 0o600); err != nil {
			t.Fatal(err)
		}
		for _, args := range [][]string{
			{"serve", "--addr", "127.0.0.1:0", "--db", filepath.Join(dir, "idem.db"), "--encryption-keys", path},
			{"proxy", "--addr", "127.0.0.1:0", "--upstream", "http://127.0.0.1:9", "--store", "memory", "--encryption-keys", path},
		} {
			code, out := runToExit(t, nil, args...)
			if code == 0 {
				t.Errorf("%s with %s: exit 0, want non-zero; output:\n%s", args[0], c.name, out)
			}
			if !strings.Contains(out, "--encryption-keys") || !strings.Contains(out, c.want) || !strings.Contains(out, path) {
				t.Errorf("%s with %s: the message does not say --encryption-keys, %q and the file:\n%s", args[0], c.name, c.want, out)
			}
			if strings.Contains(out, good) || strings.Contains(out, short) {
				t.Errorf("%s with %s: the message contains key material:\n%s", args[0], c.name, out)
			}
			if strings.Contains(out, "listening") {
				t.Errorf("%s with %s started:\n%s", args[0], c.name, out)
			}
		}
	}
	code, out := runToExit(t, nil, "serve", "--addr", "127.0.0.1:0", "--db", filepath.Join(dir, "idem.db"), "--encryption-keys", filepath.Join(dir, "missing"))
	if code == 0 || !strings.Contains(out, "no such file") {
		t.Errorf("missing keyring file: exit %d:\n%s", code, out)
	}
	// IDEM_ENCRYPTION_KEYS names the file as the flag does.
	code, out = runToExit(t, []string{"IDEM_ENCRYPTION_KEYS=" + filepath.Join(dir, "not-base64")},
		"serve", "--addr", "127.0.0.1:0", "--db", filepath.Join(dir, "idem.db"))
	if code == 0 || !strings.Contains(out, "not valid base64") {
		t.Errorf("IDEM_ENCRYPTION_KEYS with a malformed file: exit %d:\n%s", code, out)
	}
}

// stopGracefully stops s with SIGTERM in the middle of a test (a restart),
// failing the test unless it exits cleanly.
func stopGracefully(t *testing.T, s *server) {
	t.Helper()
	if err := s.stop(); err != nil {
		t.Fatalf("%s: %v", s.name, err)
	}
	s.killed = true // stopped on purpose: the cleanup only waits
}

// runToExit runs idem with args (and env added to the environment) and
// returns its exit status and combined output; it must exit by itself.
func runToExit(t *testing.T, env []string, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary(t), args...)
	cmd.Env = append(append(os.Environ(), "GORACE=atexit_sleep_ms=0"), env...)
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("idem %v did not exit: %s", args, out)
	}
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("idem %v: %v", args, err)
	}
	return code, string(out)
}

// idem proxy --encryption-keys: what a
// malicious or talkative upstream answered is stored encrypted, replays
// are byte for byte, and a proxy started without the keys answers 503 for
// the encrypted record instead of forwarding the request again.
func TestProxyEncryptionKeys(t *testing.T) {
	t.Parallel()
	marker := "MARKER-" + randomName(8)
	callc := make(chan struct{}, 100) // one value per upstream call
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		callc <- struct{}{}
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Account", marker)
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"transfer":"%s","n":%d}`, marker, len(callc))
	}))
	t.Cleanup(upstream.Close)
	records := filepath.Join(t.TempDir(), "proxy.db")
	keys := keyringFile(t, map[string]string{}, "k1")

	px := startCommand(t, "proxy-enc", "proxy", "--upstream", upstream.URL, "--store", records, "--encryption-keys", keys)
	key := "transfer-" + randomName(6)
	send := func(s *server) reply {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, s.url+"/transfers", strings.NewReader(`{"amount":1}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(idem.HeaderKey, idem.FormatKey(key))
		req.Header.Set("Authorization", "Bearer tenant-SECRET") // the proxy's default scope header
		resp, err := httpClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return reply{from: s.name, status: resp.StatusCode, header: resp.Header, body: b}
	}
	first := send(px)
	if first.status != http.StatusCreated || !bytes.Contains(first.body, []byte(marker)) {
		t.Fatalf("first: %v", first)
	}
	checkReplay(t, first, send(px))
	if !px.log.contains(`"encryption":"AES-256-GCM, keys k1, new records under k1"`) {
		t.Errorf("the start-up line does not describe the encryption; log:\n%s", px.log.tail(5))
	}
	stopGracefully(t, px)
	if raw := sqliteFiles(t, records); len(raw) == 0 || bytes.Contains(raw, []byte(marker)) || bytes.Contains(raw, []byte("tenant-SECRET")) {
		t.Fatalf("the records file (%d bytes) holds the upstream's response in clear", len(raw))
	}
	plain := startCommand(t, "proxy-no-keys", "proxy", "--upstream", upstream.URL, "--store", records)
	if r := send(plain); r.status != http.StatusServiceUnavailable || r.problemCode() != idem.CodeRecordUnreadable {
		t.Fatalf("without keys: %v, want 503 %s", r, idem.CodeRecordUnreadable)
	}
	if len(callc) != 1 {
		t.Fatalf("the upstream was called %d times, want 1", len(callc))
	}
}

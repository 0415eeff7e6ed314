package cli

import (
	"encoding/base64"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/cmd/idem/internal/backend"
	"github.com/idemhq/idem/idemstore"
)

// idem inspect on an encrypted record: without --encryption-keys it says
// the response is encrypted and prints no ciphertext; with the keys it
// shows the response; with other keys it says why it cannot.
func TestInspectEncryptedRecord(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	spec := filepath.Join(dir, "records.db")
	writeKeys := func(name string, key byte) string {
		path := filepath.Join(dir, name)
		line := "1:" + base64.StdEncoding.EncodeToString([]byte(strings.Repeat(string(rune(key)), 32))) + "\n"
		if err := os.WriteFile(path, []byte(line), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	keys, other := writeKeys("keys", 'a'), writeKeys("other", 'b')
	enc, _, err := loadEncryption(keys, nil, nil)
	if err != nil {
		t.Fatal(err)
	}

	// A completed record, sealed as idem serve --encryption-keys seals it.
	s, err := backend.Open(t.Context(), spec)
	if err != nil {
		t.Fatal(err)
	}
	scope, now := idem.Scope("acme", "POST /payments"), time.Now()
	p := idemstore.ClaimParams{Scope: scope, Key: "order-1", Fingerprint: idem.FingerprintVersion + ":abc", Token: "tok",
		Lease: time.Minute, TTL: time.Hour, Now: now}
	if _, err := s.Records.Claim(t.Context(), p); err != nil {
		t.Fatal(err)
	}
	sealed, err := enc.Seal(t.Context(), scope, p.Key, &idem.Response{StatusCode: http.StatusCreated,
		Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"id":"pay_1","secret":"card-4242"}`)})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Records.Complete(t.Context(), idemstore.CompleteParams{Scope: scope, Key: p.Key, Token: p.Token, Response: sealed, Now: now}); err != nil {
		t.Fatal(err)
	}
	s.Close()

	code, out, errs := run(t, "inspect", "--store", spec, "--show-body", "order-1")
	if code != exitOK || !strings.Contains(out, "encryption:") || !strings.Contains(out, "give --encryption-keys") {
		t.Fatalf("inspect without keys: exit %d: %s\n%s", code, errs, out)
	}
	if strings.Contains(out, "idem-envelope") || strings.Contains(out, "response status") {
		t.Errorf("inspect without keys printed the sealed form:\n%s", out)
	}

	code, out, errs = run(t, "inspect", "--store", spec, "--show-body", "--encryption-keys", keys, "order-1")
	for _, want := range []string{"decrypted with --encryption-keys", "response status:     201", `{"id":"pay_1","secret":"card-4242"}`, "Content-Type: application/json"} {
		if code != exitOK || !strings.Contains(out, want) {
			t.Errorf("inspect with the keys: exit %d, lacks %q: %s\n%s", code, want, errs, out)
		}
	}

	code, out, _ = run(t, "inspect", "--store", spec, "--show-body", "--json", "--encryption-keys", other, "order-1")
	var recs []recordJSON
	if err := json.Unmarshal([]byte(out), &recs); code != exitOK || err != nil || len(recs) != 1 {
		t.Fatalf("inspect --json with other keys: exit %d, %v:\n%s", code, err, out)
	}
	if r := recs[0]; !strings.Contains(r.Encryption, "unreadable") || r.Body != nil || r.Status != 0 {
		t.Errorf("inspect --json with other keys: %+v", r)
	}

	if code, _, errs = run(t, "inspect", "--store", spec, "--encryption-keys", filepath.Join(dir, "missing"), "order-1"); code != exitError || !strings.Contains(errs, "--encryption-keys") {
		t.Errorf("inspect with a missing keyring: exit %d: %s", code, errs)
	}
}

package cli

import (
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/cmd/idem/internal/backend"
	"github.com/idemhq/idem/idemstore"
)

// A keyring file others can read (or write) is reported with its path, its
// mode and the command that fixes it; one only its owner can use is not.
func TestKeyringPermissions(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	line := "1:" + base64.StdEncoding.EncodeToString(make([]byte, 32)) + "\n"
	for _, c := range []struct {
		mode os.FileMode
		want string // "" when no warning is expected
	}{
		{0o600, ""}, {0o400, ""}, {0o700, ""},
		{0o644, "other users (mode 0644)"}, {0o604, "other users (mode 0604)"}, {0o606, "other users"},
		{0o640, "its group (mode 0640)"}, {0o620, "its group"},
	} {
		path := filepath.Join(dir, "keys "+c.mode.String())
		if err := os.WriteFile(path, []byte(line), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(path, c.mode); err != nil { // WriteFile's mode passes through the umask
			t.Fatal(err)
		}
		var warnings []string
		if _, _, err := loadEncryption(path, nil, func(msg string) { warnings = append(warnings, msg) }); err != nil {
			t.Fatalf("%v: %v", c.mode, err)
		}
		switch {
		case c.want == "" && len(warnings) != 0:
			t.Errorf("%v: unexpected warning %q", c.mode, warnings)
		case c.want != "" && len(warnings) != 1:
			t.Errorf("%v: warnings %q, want one", c.mode, warnings)
		case c.want != "":
			for _, s := range []string{c.want, path, "chmod 600 '" + path + "'"} {
				if !strings.Contains(warnings[0], s) {
					t.Errorf("%v: warning %q lacks %q", c.mode, warnings[0], s)
				}
			}
		}
	}
}

// --accept-plaintext without --encryption-keys is a usage error (exit 2)
// on both commands that take it; it starts nothing.
func TestAcceptPlaintextNeedsKeys(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, args := range [][]string{
		{"serve", "--addr", "127.0.0.1:0", "--db", filepath.Join(dir, "idem.db"), "--accept-plaintext"},
		{"proxy", "--addr", "127.0.0.1:0", "--upstream", "http://127.0.0.1:9", "--store", "memory", "--accept-plaintext"},
	} {
		code, out, errs := run(t, args...)
		if code != exitUsage || !strings.Contains(errs, "--accept-plaintext needs --encryption-keys") || strings.Contains(errs+out, "listening") {
			t.Errorf("%s --accept-plaintext without keys: exit %d, stderr:\n%s", args[0], code, errs)
		}
	}
}

// idem inspect on a record in flight at its recovery point: the steps are
// listed (their data only with --show-body); a sealed recovery point is
// shown only with the keys that sealed it, and never as ciphertext.
func TestInspectRecoveryPoint(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	spec := filepath.Join(dir, "records.db")
	keys := filepath.Join(dir, "keys")
	if err := os.WriteFile(keys, []byte("k1:"+base64.StdEncoding.EncodeToString([]byte(strings.Repeat("k", 32)))+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	enc, _, err := loadEncryption(keys, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	const secret = `{"reference":"order-SECRET-77","amountCents":4200}`
	plain := []byte(`{"v":1,"steps":[{"name":"payment","done":true,"data":"` + base64.StdEncoding.EncodeToString([]byte(secret)) +
		`"},{"name":"charge","unknown":true}]}`)
	s, err := backend.Open(t.Context(), spec)
	if err != nil {
		t.Fatal(err)
	}
	scope, now := idem.Scope("acme", "POST /payments"), time.Now()
	save := func(key string, cp []byte) {
		p := idemstore.ClaimParams{Scope: scope, Key: key, Fingerprint: idem.FingerprintVersion + ":abc", Token: "tok-" + key,
			Lease: time.Minute, TTL: time.Hour, Now: now}
		if _, err := s.Records.Claim(t.Context(), p); err != nil {
			t.Fatal(err)
		}
		if err := s.Records.(idemstore.StepStore).SaveCheckpoint(t.Context(), idemstore.SaveCheckpointParams{Scope: scope, Key: key,
			Token: p.Token, Checkpoint: cp, Now: now}); err != nil {
			t.Fatal(err)
		}
	}
	sealed, err := enc.SealCheckpoint(t.Context(), scope, "sealed", idem.FingerprintVersion+":abc", plain)
	if err != nil {
		t.Fatal(err)
	}
	save("sealed", sealed)
	save("clear", plain)
	s.Close()

	const steps = "steps:               payment (done), charge (outcome unknown)"
	code, out, errs := run(t, "inspect", "--store", spec, "clear")
	if code != exitOK || !strings.Contains(out, steps) || strings.Contains(out, "order-SECRET") {
		t.Errorf("inspect of a recovery point in clear: exit %d: %s\n%s", code, errs, out)
	}
	code, out, errs = run(t, "inspect", "--store", spec, "--show-body", "clear")
	if code != exitOK || !strings.Contains(out, "step payment: "+secret) {
		t.Errorf("inspect --show-body of a recovery point in clear: exit %d: %s\n%s", code, errs, out)
	}
	code, out, errs = run(t, "inspect", "--store", spec, "--show-body", "sealed")
	if code != exitOK || !strings.Contains(out, "recovery point encrypted; give --encryption-keys") || strings.Contains(out, "steps:") ||
		strings.Contains(out, "idemcp1") {
		t.Errorf("inspect of a sealed recovery point without keys: exit %d: %s\n%s", code, errs, out)
	}
	code, out, errs = run(t, "inspect", "--store", spec, "--show-body", "--encryption-keys", keys, "sealed")
	for _, want := range []string{"decrypted with --encryption-keys", steps, "step payment: " + secret} {
		if code != exitOK || !strings.Contains(out, want) {
			t.Errorf("inspect of a sealed recovery point with the keys: exit %d, lacks %q: %s\n%s", code, want, errs, out)
		}
	}
	code, out, _ = run(t, "inspect", "--store", spec, "--json", "--show-body", "--encryption-keys", keys, "sealed")
	var recs []recordJSON
	if err := json.Unmarshal([]byte(out), &recs); code != exitOK || err != nil || len(recs) != 1 {
		t.Fatalf("inspect --json: exit %d, %v:\n%s", code, err, out)
	}
	if st := recs[0].Steps; len(st) != 2 || st[0].Name != "payment" || st[0].State != "done" || st[0].Data == nil || *st[0].Data != secret ||
		st[1].State != "unknown" || st[1].Data != nil {
		t.Errorf("inspect --json steps: %+v", st)
	}
	code, out, _ = run(t, "inspect", "--store", spec, "--json", "--encryption-keys", keys, "sealed")
	if recs = nil; json.Unmarshal([]byte(out), &recs) != nil || len(recs) != 1 || len(recs[0].Steps) != 2 || recs[0].Steps[0].Data != nil {
		t.Errorf("inspect --json without --show-body: exit %d:\n%s", code, out)
	}
}

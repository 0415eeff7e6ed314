package e2e

import (
	"bytes"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemcrypt"
)

// storedCheckpoint is one records row as the database holds it.
type storedCheckpoint struct {
	scope, key, fingerprint string
	checkpoint              []byte
}

// encryptedBackend is a --db for `idem serve --provider` with raw access to
// its records table, as a database login or a backup has.
type encryptedBackend struct {
	name string
	open func(t *testing.T) (db string, rows func(t *testing.T) []storedCheckpoint)
}

var encryptedBackends = []encryptedBackend{
	{"SQLite", func(t *testing.T) (string, func(t *testing.T) []storedCheckpoint) {
		path := filepath.Join(t.TempDir(), "serve.db")
		return path, func(t *testing.T) []storedCheckpoint {
			t.Helper()
			db, err := sql.Open("sqlite", "file:"+path+"?mode=ro&_pragma=busy_timeout(5000)")
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			rows, err := db.QueryContext(testContext(t), `SELECT scope, key, fingerprint, checkpoint FROM idem_records`)
			if err != nil {
				t.Fatal(err)
			}
			return scanCheckpoints(t, rows)
		}
	}},
	{"PostgreSQL", func(t *testing.T) (string, func(t *testing.T) []storedCheckpoint) {
		pg := newPGDatabase(t)
		return pg.url, func(t *testing.T) []storedCheckpoint {
			t.Helper()
			rows, err := pg.pool.Query(testContext(t), `SELECT scope, key, fingerprint, checkpoint FROM idem.idempotency_records`)
			if err != nil {
				t.Fatal(err)
			}
			defer rows.Close()
			var out []storedCheckpoint
			for rows.Next() {
				var r storedCheckpoint
				if err := rows.Scan(&r.scope, &r.key, &r.fingerprint, &r.checkpoint); err != nil {
					t.Fatal(err)
				}
				out = append(out, r)
			}
			if err := rows.Err(); err != nil {
				t.Fatal(err)
			}
			return out
		}
	}},
}

func scanCheckpoints(t *testing.T, rows *sql.Rows) []storedCheckpoint {
	t.Helper()
	defer rows.Close()
	var out []storedCheckpoint
	for rows.Next() {
		var r storedCheckpoint
		if err := rows.Scan(&r.scope, &r.key, &r.fingerprint, &r.checkpoint); err != nil {
			t.Fatal(err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// onlyRow returns the one records row.
func onlyRow(t *testing.T, rows []storedCheckpoint) storedCheckpoint {
	t.Helper()
	if len(rows) != 1 {
		t.Fatalf("%d records rows, want 1", len(rows))
	}
	return rows[0]
}

// idem serve --provider --encryption-keys, killed after the provider
// charged and the charge was recorded: the recovery point in the real
// SQLite file and PostgreSQL table is sealed (no amount, reference, payment
// id or provider key in it, in clear or base64, and it opens with the
// keyring to the payment's steps); restarted with the keys, the retry
// resumes and the provider holds exactly one charge.
func TestProviderEncryptedCrashResume(t *testing.T) {
	t.Parallel()
	for _, b := range encryptedBackends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			keys := keyringFile(t, map[string]string{}, "k1")
			prov := startProvider(t)
			db, rows := b.open(t)
			doomed := startProviderServe(t, "serve-enc-doomed", anyPort, db, prov.url, "after-charge-recorded",
				"--reconcile-interval", "0", "--encryption-keys", keys)
			key := "enc-crash-" + randomName(8)
			ref := "order-SECRET-" + randomName(6)
			body := paymentBody(4242, ref)
			if r, err := postPayment(httpClient, doomed.url, key, body); err == nil {
				t.Fatalf("the request crossing the crash point got an answer: %v", r)
			}
			doomed.expectCrash(t)

			row := onlyRow(t, rows(t))
			cp := row.checkpoint
			if len(cp) == 0 || cp[0] == '{' || !bytes.HasPrefix(cp, []byte("\x00idemcp1")) {
				t.Fatalf("the stored recovery point is not sealed (%d bytes): %q", len(cp), cp)
			}
			// What the sealed bytes hold: the steps, opened with the
			// keyring the server used.
			kr, err := idemcrypt.LoadKeyring(keys)
			if err != nil {
				t.Fatal(err)
			}
			enc, err := idemcrypt.New(kr, nil)
			if err != nil {
				t.Fatal(err)
			}
			plain, err := enc.OpenCheckpoint(testContext(t), row.scope, row.key, row.fingerprint, cp)
			if err != nil {
				t.Fatalf("the stored recovery point does not open with the keyring: %v", err)
			}
			steps, err := idem.ParseCheckpoint(plain)
			if err != nil || len(steps) != 2 || !steps[0].Done || !steps[1].Done {
				t.Fatalf("the opened recovery point: %v, %v; want the payment and charge steps done", steps, err)
			}
			var p stepPayment
			if err := json.Unmarshal(steps[0].Data, &p); err != nil || p.Reference != ref || p.ID == "" || p.ProviderKey == "" {
				t.Fatalf("the payment step's data %q: %v", steps[0].Data, err)
			}
			for _, secret := range [][]byte{[]byte(ref), []byte(p.ID), []byte(p.ProviderKey), steps[1].Data, []byte("amountCents"),
				plain[1 : len(plain)-1]} {
				if bytes.Contains(cp, secret) {
					t.Errorf("the stored recovery point contains %q", secret)
				}
			}

			again := startProviderServe(t, "serve-enc-restarted", doomed.addr, db, prov.url, "", "--reconcile-interval", "0", "--encryption-keys", keys)
			first, err := postPayment(retryingClient(t), again.url, key, body)
			if err != nil {
				t.Fatal(err)
			}
			checkCharged(t, again.url, prov.url, first)
			var count struct{ Count int64 }
			getJSON(t, prov.url+"/v1/charges/count", &count)
			if count.Count != 1 {
				t.Errorf("%d charges at the provider, want 1", count.Count)
			}
			if row := onlyRow(t, rows(t)); row.checkpoint != nil {
				t.Errorf("the completed record still holds a recovery point (%d bytes)", len(row.checkpoint))
			}
		})
	}
}

// A provider payment stopped at a recovery point written before encryption
// was turned on: restarted with --encryption-keys alone, the retry answers
// 503 record_unreadable and nothing is charged; with --accept-plaintext it
// resumes, and the provider holds exactly one charge.
func TestProviderAcceptPlaintextResumes(t *testing.T) {
	t.Parallel()
	keys := keyringFile(t, map[string]string{}, "k1")
	prov := startProvider(t)
	db := filepath.Join(t.TempDir(), "serve.db")
	doomed := startProviderServe(t, "serve-plain", anyPort, db, prov.url, "after-payment", "--reconcile-interval", "0")
	addr := doomed.addr
	key := "plain-era-" + randomName(8)
	body := paymentBody(1500, "order-"+key)
	if r, err := postPayment(httpClient, doomed.url, key, body); err == nil {
		t.Fatalf("the request crossing the crash point got an answer: %v", r)
	}
	doomed.expectCrash(t)

	strict := startProviderServe(t, "serve-keys", addr, db, prov.url, "", "--reconcile-interval", "0", "--encryption-keys", keys)
	// The dead process's lease (1 s) ends first: 409 until then.
	var last reply
	eventually(t, 30*time.Second, 50*time.Millisecond, "503 record_unreadable once the lease ended", func() (bool, error) {
		r, err := postPayment(httpClient, strict.url, key, body)
		last = r
		return err == nil && r.status == http.StatusServiceUnavailable && r.problemCode() == idem.CodeRecordUnreadable, err
	})
	// Not held up by a lease: the next retry answers the same at once.
	if r, err := postPayment(httpClient, strict.url, key, body); err != nil || r.problemCode() != idem.CodeRecordUnreadable {
		t.Fatalf("second retry without --accept-plaintext: %v, %v (first: %v)", r, err, last)
	}
	var count struct{ Count int64 }
	getJSON(t, prov.url+"/v1/charges/count", &count)
	if count.Count != 0 {
		t.Fatalf("%d charges while the recovery point was unreadable, want 0", count.Count)
	}
	stopGracefully(t, strict)

	lenient := startProviderServe(t, "serve-accept", addr, db, prov.url, "", "--reconcile-interval", "0",
		"--encryption-keys", keys, "--accept-plaintext")
	first, err := postPayment(retryingClient(t), lenient.url, key, body)
	if err != nil {
		t.Fatal(err)
	}
	checkCharged(t, lenient.url, prov.url, first)
	getJSON(t, prov.url+"/v1/charges/count", &count)
	if count.Count != 1 {
		t.Errorf("%d charges, want 1", count.Count)
	}
	// Completed with the keys, the record's response is sealed: it
	// replays without --accept-plaintext too.
	stopGracefully(t, lenient)
	again := startProviderServe(t, "serve-keys-again", addr, db, prov.url, "", "--reconcile-interval", "0", "--encryption-keys", keys)
	r, err := postPayment(httpClient, again.url, key, body)
	if err != nil || r.replayed() != "true" || !bytes.Equal(r.body, first.body) {
		t.Fatalf("retry after completion, keys alone: %v, %v; want the replay of %v", r, err, first)
	}
}

// Turning encryption on over live plaintext records: idem serve started
// without keys makes payments; restarted with --encryption-keys alone, their
// retries answer 503 record_unreadable and run nothing; with
// --accept-plaintext they replay byte for byte, and new payments are stored
// sealed; without the flag again, the new ones replay and the old ones
// answer 503.
func TestServeAcceptPlaintext(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	payments, records := filepath.Join(dir, "payments.db"), filepath.Join(dir, "records.db")
	keys := keyringFile(t, map[string]string{}, "1")
	marker := "MARKER-" + randomName(8)
	oldKeys := []string{"old-a-" + randomName(6), "old-b-" + randomName(6)}
	bodies := map[string]string{}
	args := func(extra ...string) []string {
		return append([]string{"--db", payments, "--store", records}, extra...)
	}

	plain := startServer(t, "no-keys", args()...)
	olds := map[string]reply{}
	for i, k := range oldKeys {
		bodies[k] = paymentBody(100+i, marker+"-old-"+k)
		olds[k] = mustPay(t, plain, k, bodies[k])
		if olds[k].status != http.StatusCreated {
			t.Fatalf("payment without keys: %v", olds[k])
		}
	}
	stopGracefully(t, plain)
	if !bytes.Contains(sqliteFiles(t, records), []byte(marker+"-old")) {
		t.Fatal("the plaintext-era responses are not in the records file: the check below would prove nothing")
	}

	strict := startServer(t, "keys", args("--encryption-keys", keys)...)
	for _, k := range oldKeys {
		if r := mustPay(t, strict, k, bodies[k]); r.status != http.StatusServiceUnavailable || r.problemCode() != idem.CodeRecordUnreadable {
			t.Fatalf("plaintext-era record with keys alone: %v, want 503 %s", r, idem.CodeRecordUnreadable)
		}
	}
	if n := apiCount(t, strict); n != 2 {
		t.Fatalf("%d payments, want 2: a plaintext-era retry ran again", n)
	}
	stopGracefully(t, strict)

	lenient := startServer(t, "keys+accept", args("--encryption-keys", keys, "--accept-plaintext")...)
	if !lenient.log.contains("records stored in clear are accepted (--accept-plaintext)") || !lenient.log.contains(`"remove_after"`) {
		t.Errorf("the start-up log does not say that records in clear are accepted, and until when; log:\n%s", lenient.log.tail(8))
	}
	for _, k := range oldKeys {
		r := mustPay(t, lenient, k, bodies[k])
		if r.replayed() != "true" {
			t.Errorf("plaintext-era record with --accept-plaintext: %v, want a replay", r)
		}
		checkReplay(t, olds[k], r)
	}
	newKey, newBody := "new-"+randomName(6), paymentBody(777, marker+"-new")
	fresh := mustPay(t, lenient, newKey, newBody)
	if fresh.status != http.StatusCreated {
		t.Fatalf("new payment with --accept-plaintext: %v", fresh)
	}
	checkReplay(t, fresh, mustPay(t, lenient, newKey, newBody))
	stopGracefully(t, lenient)
	if raw := sqliteFiles(t, records); bytes.Contains(raw, []byte(marker+"-new")) || bytes.Contains(raw, []byte(fresh.paymentID(t))) {
		t.Fatal("the payment made with --accept-plaintext is stored in clear")
	}

	after := startServer(t, "keys-again", args("--encryption-keys", keys)...)
	checkReplay(t, fresh, mustPay(t, after, newKey, newBody))
	if r := mustPay(t, after, oldKeys[0], bodies[oldKeys[0]]); r.problemCode() != idem.CodeRecordUnreadable {
		t.Errorf("plaintext-era record without --accept-plaintext again: %v, want 503 %s", r, idem.CodeRecordUnreadable)
	}
	if n := apiCount(t, after); n != 3 {
		t.Errorf("%d payments, want 3", n)
	}
}

// A keyring file others can read makes idem serve and idem proxy warn on
// stderr, naming the file and the fix; one with mode 0600 does not.
func TestKeyringPermissionWarning(t *testing.T) {
	t.Parallel()
	open := keyringFile(t, map[string]string{}, "1")
	if err := os.Chmod(open, 0o644); err != nil {
		t.Fatal(err)
	}
	closed := keyringFile(t, map[string]string{}, "1") // 0600
	for _, c := range []struct {
		path string
		warn bool
	}{{open, true}, {closed, false}} {
		for _, cmd := range [][]string{
			{"serve", "--db", filepath.Join(t.TempDir(), "idem.db")},
			{"proxy", "--upstream", "http://127.0.0.1:9", "--store", "memory"},
		} {
			s := startCommand(t, cmd[0]+"-keys", cmd[0], append(cmd[1:], "--encryption-keys", c.path)...)
			warned := s.log.contains("keyring file") && s.log.contains(c.path) && s.log.contains("chmod 600 "+c.path)
			if warned != c.warn {
				t.Errorf("%s with a keyring of mode %v: warned %v, want %v; log:\n%s", cmd[0], map[bool]string{true: "0644", false: "0600"}[c.warn],
					warned, c.warn, s.log.tail(6))
			}
			if c.warn && !strings.Contains(s.log.tail(20), `"level":"WARN"`) {
				t.Errorf("%s: the keyring warning is not logged at WARN:\n%s", cmd[0], s.log.tail(6))
			}
			stopGracefully(t, s)
		}
	}
}

// idem proxy over a store written without keys: with --encryption-keys
// alone the stored response answers 503 record_unreadable and the upstream
// is not called again; with --accept-plaintext it replays byte for byte.
func TestProxyAcceptPlaintext(t *testing.T) {
	t.Parallel()
	calls := make(chan struct{}, 100)
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls <- struct{}{}
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"transfer":%d}`, len(calls))
	}))
	t.Cleanup(upstream.Close)
	records := filepath.Join(t.TempDir(), "proxy.db")
	keys := keyringFile(t, map[string]string{}, "k1")
	key := "transfer-" + randomName(6)
	send := func(s *server) reply {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, s.url+"/transfers", strings.NewReader(`{"amount":1}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(idem.HeaderKey, idem.FormatKey(key))
		req.Header.Set("Authorization", "Bearer tenant-a")
		resp, err := httpClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return reply{from: s.name, status: resp.StatusCode, header: resp.Header, body: b}
	}
	plain := startCommand(t, "proxy-plain", "proxy", "--upstream", upstream.URL, "--store", records)
	first := send(plain)
	if first.status != http.StatusCreated {
		t.Fatalf("first: %v", first)
	}
	stopGracefully(t, plain)

	strict := startCommand(t, "proxy-keys", "proxy", "--upstream", upstream.URL, "--store", records, "--encryption-keys", keys)
	if r := send(strict); r.status != http.StatusServiceUnavailable || r.problemCode() != idem.CodeRecordUnreadable {
		t.Fatalf("keys alone: %v, want 503 %s", r, idem.CodeRecordUnreadable)
	}
	stopGracefully(t, strict)

	lenient := startCommand(t, "proxy-accept", "proxy", "--upstream", upstream.URL, "--store", records,
		"--encryption-keys", keys, "--accept-plaintext")
	r := send(lenient)
	if r.replayed() != "true" {
		t.Errorf("with --accept-plaintext: %v, want a replay", r)
	}
	checkReplay(t, first, r)
	if len(calls) != 1 {
		t.Errorf("the upstream was called %d times, want 1", len(calls))
	}
}

package idem_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemcrypt"
	"github.com/idemhq/idem/idemstore"
	"github.com/idemhq/idem/memstore"
	"github.com/idemhq/idem/storetest"
)

// testKey derives a deterministic 32-byte key from a name.
func testKey(name string) []byte {
	k := sha256.Sum256([]byte("idem test key " + name))
	return k[:]
}

// keyringText is a keyring file with the given ids, newest last.
func keyringText(ids ...string) string {
	var b strings.Builder
	for _, id := range ids {
		fmt.Fprintf(&b, "%s:%s\n", id, base64.StdEncoding.EncodeToString(testKey(id)))
	}
	return b.String()
}

func newEncryption(t testing.TB, cfg *idemcrypt.Config, ids ...string) *idemcrypt.Encryption {
	t.Helper()
	kr, err := idemcrypt.ParseKeyring([]byte(keyringText(ids...)))
	if err != nil {
		t.Fatal(err)
	}
	enc, err := idemcrypt.New(kr, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return enc
}

func TestParseKeyring(t *testing.T) {
	t.Parallel()
	good := base64.StdEncoding.EncodeToString(testKey("a"))
	short := base64.StdEncoding.EncodeToString(make([]byte, 16))
	cases := []struct {
		name, text string
		ids        []string // nil: an error is expected
		errHas     string
	}{
		{"one", "1:" + good, []string{"1"}, ""},
		{"newest last, comments, blanks, spaces", "# keys\n\n  old:" + good + "  \r\nnew:" + good + "\n", []string{"old", "new"}, ""},
		{"empty", "", nil, "no keys"},
		{"only comments", "# nothing\n\n", nil, "no keys"},
		{"no colon", good, nil, "line 1"},
		{"empty id", ":" + good, nil, "invalid key id"},
		{"bad id", "a b:" + good, nil, "invalid key id"},
		{"long id", strings.Repeat("x", 65) + ":" + good, nil, "invalid key id"},
		{"duplicate", "1:" + good + "\n1:" + good, nil, "duplicate"},
		{"not base64", "1:not*base64", nil, "not valid base64"},
		{"16 bytes", "1:" + short, nil, "want 32"},
		{"unpadded", "1:" + strings.TrimRight(good, "="), nil, "base64"},
		{"second line bad", "1:" + good + "\n2:" + short, nil, "line 2"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			kr, err := idemcrypt.ParseKeyring([]byte(c.text))
			if c.ids == nil {
				if err == nil {
					t.Fatalf("ParseKeyring(%q): no error", c.text)
				}
				if !strings.Contains(err.Error(), c.errHas) {
					t.Errorf("error %q does not mention %q", err, c.errHas)
				}
				if strings.Contains(err.Error(), good) || strings.Contains(err.Error(), short) {
					t.Errorf("error %q contains key material", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := kr.IDs(); strings.Join(got, ",") != strings.Join(c.ids, ",") {
				t.Errorf("IDs = %v, want %v", got, c.ids)
			}
			if kr.CurrentID() != c.ids[len(c.ids)-1] {
				t.Errorf("CurrentID = %q", kr.CurrentID())
			}
		})
	}
}

func FuzzParseKeyring(f *testing.F) {
	f.Add([]byte(keyringText("1")))
	f.Add([]byte(keyringText("old", "new") + "# c\n\n"))
	f.Add([]byte("1:AAAA\n"))
	f.Add([]byte(":::\n\r\n#"))
	f.Fuzz(func(t *testing.T, data []byte) {
		kr, err := idemcrypt.ParseKeyring(data)
		if err != nil {
			if kr != nil {
				t.Fatal("keyring with an error")
			}
			return
		}
		// A keyring that parses works: it wraps under its newest key and
		// unwraps what it wrapped.
		ids := kr.IDs()
		if len(ids) == 0 || kr.CurrentID() != ids[len(ids)-1] {
			t.Fatalf("ids %v, current %q", ids, kr.CurrentID())
		}
		dk := testKey("data")
		id, w, err := kr.WrapKey(context.Background(), dk, []byte("aad"))
		if err != nil || id != kr.CurrentID() {
			t.Fatalf("WrapKey: %q %v", id, err)
		}
		got, err := kr.UnwrapKey(context.Background(), id, w, []byte("aad"))
		if err != nil || !bytes.Equal(got, dk) {
			t.Fatalf("UnwrapKey: %v", err)
		}
	})
}

func sampleResponse() *idem.Response {
	return &idem.Response{StatusCode: 201, Header: http.Header{"Content-Type": {"application/json"}, "Location": {"/payments/1"}},
		Body: []byte(`{"id":"pay_1","card":"MARKER-4242"}`)}
}

func TestSealOpen(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	enc := newEncryption(t, nil, "1")
	scope, key := idem.Scope("tenant-a", "POST /payments"), "k1"
	want := sampleResponse()
	sealed, err := enc.Seal(ctx, scope, key, want)
	if err != nil {
		t.Fatal(err)
	}
	plain, _ := want.MarshalBinary()
	raw, _ := sealed.MarshalBinary()
	for _, secret := range []string{"MARKER-4242", "/payments/1", "application/json"} {
		if bytes.Contains(raw, []byte(secret)) {
			t.Errorf("sealed record contains %q", secret)
		}
	}
	got, err := enc.Open(ctx, scope, key, sealed)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := got.MarshalBinary(); !bytes.Equal(b, plain) {
		t.Fatalf("round trip: %q, want %q", b, plain)
	}
	// Two seals of one response differ: a fresh data key and nonce each.
	again, _ := enc.Seal(ctx, scope, key, want)
	if bytes.Equal(again.Body, sealed.Body) {
		t.Error("two seals are identical")
	}

	t.Run("OtherRecord", func(t *testing.T) {
		for _, c := range []struct{ scope, key string }{
			{scope, "k2"}, {idem.Scope("tenant-b", "POST /payments"), key}, {idem.Scope("tenant-a", "POST /refunds"), key},
		} {
			if _, err := enc.Open(ctx, c.scope, c.key, sealed); !errors.Is(err, idem.ErrRecordUnreadable) || !errors.Is(err, idemcrypt.ErrDecrypt) {
				t.Errorf("Open under (%q, %q): %v, want ErrRecordUnreadable and ErrDecrypt", c.scope, c.key, err)
			}
		}
	})
	t.Run("EveryByteTampered", func(t *testing.T) {
		raw, _ := sealed.MarshalBinary()
		for i := range raw {
			for _, bit := range []byte{0x01, 0x80} {
				b := bytes.Clone(raw)
				b[i] ^= bit
				var bad idem.Response
				if bad.UnmarshalBinary(b) != nil {
					continue // the store's own decoding refuses it
				}
				if again, _ := bad.MarshalBinary(); bytes.Equal(again, raw) {
					continue // a bit the encoding ignores: the same record
				}
				if r, err := enc.Open(ctx, scope, key, &bad); err == nil || r != nil {
					t.Fatalf("stored byte %d ^ %#x: opened %v", i, bit, r)
				}
			}
		}
		for _, n := range []int{1, len(sealed.Body) / 2, len(sealed.Body)} {
			bad := *sealed
			bad.Body = sealed.Body[:len(sealed.Body)-n]
			if _, err := enc.Open(ctx, scope, key, &bad); !errors.Is(err, idem.ErrRecordUnreadable) {
				t.Fatalf("body truncated by %d: %v", n, err)
			}
		}
		if len(sealed.Body) != len(want.Body) {
			t.Errorf("sealed body is %d bytes, want %d (the plain body's length)", len(sealed.Body), len(want.Body))
		}
	})
	t.Run("UnknownKeyID", func(t *testing.T) {
		other := newEncryption(t, nil, "2")
		if _, err := other.Open(ctx, scope, key, sealed); !errors.Is(err, idemcrypt.ErrUnknownKeyID) || !errors.Is(err, idem.ErrRecordUnreadable) {
			t.Fatalf("Open with a keyring without key 1: %v", err)
		}
	})
	t.Run("SameIDOtherKey", func(t *testing.T) {
		kr, _ := idemcrypt.NewKeyring(idemcrypt.Key{ID: "1", Key: testKey("not 1")})
		other, _ := idemcrypt.New(kr, nil)
		if _, err := other.Open(ctx, scope, key, sealed); !errors.Is(err, idemcrypt.ErrDecrypt) {
			t.Fatalf("Open with another key named 1: %v", err)
		}
	})
	t.Run("EncryptionOff", func(t *testing.T) {
		var off *idemcrypt.Encryption
		if _, err := off.Open(ctx, scope, key, sealed); !errors.Is(err, idem.ErrRecordUnreadable) {
			t.Fatalf("Open of a sealed record without keys: %v", err)
		}
		if r, err := off.Open(ctx, scope, key, want); err != nil || r != want {
			t.Fatalf("Open of a plain record without keys: %v %v", r, err)
		}
	})
	t.Run("Plaintext", func(t *testing.T) {
		if _, err := enc.Open(ctx, scope, key, want); !errors.Is(err, idem.ErrRecordUnreadable) {
			t.Fatalf("plain record with encryption on: %v", err)
		}
		lenient := newEncryption(t, &idemcrypt.Config{AcceptPlaintext: true}, "1")
		if r, err := lenient.Open(ctx, scope, key, want); err != nil || r != want {
			t.Fatalf("plain record with AcceptPlaintext: %v %v", r, err)
		}
	})
}

func FuzzEnvelopeOpen(f *testing.F) {
	enc := newEncryption(f, nil, "1")
	sealed, err := enc.Seal(context.Background(), "s", "k", sampleResponse())
	if err != nil {
		f.Fatal(err)
	}
	env := sealed.Header.Values(":idem-envelope")
	f.Add(env[0], env[1], sealed.Body)
	f.Add("v1", "AQExAA", []byte{})
	f.Add("v1", "", []byte("x"))
	f.Fuzz(func(t *testing.T, version, envelope string, body []byte) {
		r := &idem.Response{StatusCode: 200, Header: http.Header{":idem-envelope": {version, envelope}}, Body: body}
		got, err := enc.Open(context.Background(), "s", "k", r)
		if err != nil {
			if got != nil || !errors.Is(err, idem.ErrRecordUnreadable) {
				t.Fatalf("Open: %v, %v", got, err)
			}
			return
		}
		// Only a real seal opens (the seed's, sealed with the same key in
		// whichever process made it), and to what was sealed.
		want, _ := sampleResponse().MarshalBinary()
		if b, _ := got.MarshalBinary(); !bytes.Equal(b, want) {
			t.Fatalf("forged envelope %q, body %q opened to %q", envelope, body, b)
		}
	})
}

func TestNewEncryption(t *testing.T) {
	t.Parallel()
	kr, _ := idemcrypt.NewKeyring(idemcrypt.Key{ID: "1", Key: testKey("1")})
	if _, err := idemcrypt.New(nil, nil); err == nil {
		t.Error("nil provider accepted")
	}
	if _, err := idemcrypt.New(kr, &idemcrypt.Config{HashKey: make([]byte, 16)}); err == nil {
		t.Error("16-byte HashKey accepted")
	}
	if _, err := idemcrypt.NewKeyring(idemcrypt.Key{ID: "1", Key: make([]byte, 24)}); err == nil {
		t.Error("AES-192 key accepted")
	}
	if _, err := idemcrypt.NewKeyring(); err == nil {
		t.Error("empty keyring accepted")
	}
}

func TestConformanceEncrypted(t *testing.T) {
	enc := newEncryption(t, &idemcrypt.Config{HashKey: testKey("hash")}, "1")
	storetest.Run(t, storetest.Harness{
		NewStore: func(t *testing.T) idemstore.Store {
			s, err := memstore.New(nil)
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
		Encryption: enc,
	})
}

// recordingStore is a memstore that keeps every (scope, key) and response
// it is handed: what a database would hold.
type recordingStore struct {
	*memstore.Store
	mu   sync.Mutex
	seen [][]byte
}

func (s *recordingStore) Claim(ctx context.Context, p idemstore.ClaimParams) (idemstore.ClaimResult, error) {
	s.mu.Lock()
	s.seen = append(s.seen, []byte(p.Scope+"\x00"+p.Key))
	s.mu.Unlock()
	return s.Store.Claim(ctx, p)
}

func (s *recordingStore) Complete(ctx context.Context, p idemstore.CompleteParams) error {
	b, _ := p.Response.MarshalBinary()
	s.mu.Lock()
	s.seen = append(s.seen, []byte(p.Scope+"\x00"+p.Key), b)
	s.mu.Unlock()
	return s.Store.Complete(ctx, p)
}

func (s *recordingStore) contains(what string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, b := range s.seen {
		if bytes.Contains(b, []byte(what)) {
			return true
		}
	}
	return false
}

// encServer is one "process": a middleware with enc on store, in front of
// a payment handler that counts its executions.
type encServer struct {
	url  string
	runs *atomic.Int64
}

func newEncServer(t *testing.T, store idemstore.Store, enc *idemcrypt.Encryption, runs *atomic.Int64, failOpen bool) encServer {
	t.Helper()
	mw, err := idem.NewMiddleware(store, &idem.Config{Encryption: enc, FailOpen: failOpen,
		TenantFunc: func(r *http.Request) (string, error) { return r.Header.Get("X-Tenant"), nil }})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /payments", mw.Handle(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := runs.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Card", "MARKER-4242")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":"pay_%d","card":"MARKER-4242"}`, n)
	})))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return encServer{url: srv.URL, runs: runs}
}

type encReply struct {
	status             int
	replayed, code, ct string
	card               string
	body               string
}

func (s encServer) pay(t *testing.T, tenant, key string) encReply {
	t.Helper()
	req, _ := http.NewRequest("POST", s.url+"/payments", strings.NewReader(`{"amount":100}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", `"`+key+`"`)
	req.Header.Set("X-Tenant", tenant)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	r := encReply{status: resp.StatusCode, replayed: resp.Header.Get(idem.HeaderReplayed), ct: resp.Header.Get("Content-Type"),
		card: resp.Header.Get("X-Card"), body: string(b)}
	if resp.StatusCode >= 400 {
		var p struct{ Code string }
		_ = json.Unmarshal(b, &p)
		r.code = p.Code
	}
	return r
}

// TestEncryptionMiddleware: with encryption and key hashing on, what the
// store is handed names no client key or tenant and holds no response
// content, and replays are the same bytes.
func TestEncryptionMiddleware(t *testing.T) {
	t.Parallel()
	ms, _ := memstore.New(nil)
	store := &recordingStore{Store: ms}
	enc := newEncryption(t, &idemcrypt.Config{HashKey: testKey("hash")}, "1")
	var runs atomic.Int64
	srv := newEncServer(t, store, enc, &runs, false)
	first := srv.pay(t, "tenant-SECRET", "order-SECRET-1")
	again := srv.pay(t, "tenant-SECRET", "order-SECRET-1")
	if first.status != 201 || first.replayed != "false" || again.replayed != "true" || runs.Load() != 1 {
		t.Fatalf("first %+v, again %+v, runs %d", first, again, runs.Load())
	}
	if again.body != first.body || again.ct != first.ct || again.card != first.card || again.status != first.status {
		t.Fatalf("replay %+v differs from %+v", again, first)
	}
	for _, s := range []string{"MARKER-4242", "order-SECRET-1", "tenant-SECRET", "pay_1"} {
		if store.contains(s) {
			t.Errorf("the store was handed %q", s)
		}
	}
	// Another tenant with the same key is another record.
	if r := srv.pay(t, "tenant-other", "order-SECRET-1"); r.replayed != "false" || runs.Load() != 2 {
		t.Fatalf("other tenant: %+v, runs %d", r, runs.Load())
	}
}

// TestEncryptionRotation: records written under key 1; a restart with keys
// 1 and 2 still replays them and writes new records under 2; a restart with
// key 2 only answers 503 record_unreadable for the old records (even with
// FailOpen, and without executing again) and replays the new ones.
func TestEncryptionRotation(t *testing.T) {
	t.Parallel()
	store, _ := memstore.New(nil)
	var runs atomic.Int64

	v1 := newEncServer(t, store, newEncryption(t, nil, "1"), &runs, false)
	old := v1.pay(t, "t", "old")
	if old.status != 201 || runs.Load() != 1 {
		t.Fatalf("under key 1: %+v", old)
	}

	v12 := newEncServer(t, store, newEncryption(t, nil, "1", "2"), &runs, false)
	if r := v12.pay(t, "t", "old"); r.replayed != "true" || r.body != old.body {
		t.Fatalf("keys 1+2, record under 1: %+v", r)
	}
	fresh := v12.pay(t, "t", "new")
	if fresh.status != 201 || runs.Load() != 2 {
		t.Fatalf("keys 1+2, new record: %+v", fresh)
	}
	// The new record is under key 2: a keyring with key 1 only cannot read it.
	v1again := newEncServer(t, store, newEncryption(t, nil, "1"), &runs, false)
	if r := v1again.pay(t, "t", "new"); r.status != 503 || r.code != idem.CodeRecordUnreadable {
		t.Fatalf("key 1 only, record under 2: %+v", r)
	}

	v2 := newEncServer(t, store, newEncryption(t, nil, "2"), &runs, true)
	for range 2 {
		if r := v2.pay(t, "t", "old"); r.status != 503 || r.code != idem.CodeRecordUnreadable {
			t.Fatalf("key 2 only, record under 1: %+v", r)
		}
	}
	if r := v2.pay(t, "t", "new"); r.replayed != "true" || r.body != fresh.body {
		t.Fatalf("key 2 only, record under 2: %+v", r)
	}
	if runs.Load() != 2 {
		t.Fatalf("%d executions, want 2", runs.Load())
	}

	// Encryption turned off: encrypted records are unreadable, not garbage.
	off := newEncServer(t, store, nil, &runs, true)
	if r := off.pay(t, "t", "new"); r.status != 503 || r.code != idem.CodeRecordUnreadable || runs.Load() != 2 {
		t.Fatalf("no keys, encrypted record: %+v", r)
	}
}

func TestLoadKeyring(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	good := filepath.Join(dir, "keys")
	if err := os.WriteFile(good, []byte(keyringText("a", "b")), 0o600); err != nil {
		t.Fatal(err)
	}
	kr, err := idemcrypt.LoadKeyring(good)
	if err != nil || kr.CurrentID() != "b" {
		t.Fatalf("LoadKeyring: %v", err)
	}
	if _, err := idemcrypt.LoadKeyring(filepath.Join(dir, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
	huge := filepath.Join(dir, "huge")
	if err := os.WriteFile(huge, bytes.Repeat([]byte("# padding\n"), 120_000), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := idemcrypt.LoadKeyring(huge); err == nil || !strings.Contains(err.Error(), "limit") {
		t.Errorf("a 1.2 MB file: %v, want the size limit", err)
	}
	bad := filepath.Join(dir, "bad")
	if err := os.WriteFile(bad, []byte("1:AAAA\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := idemcrypt.LoadKeyring(bad); err == nil || !strings.Contains(err.Error(), bad) || !strings.Contains(err.Error(), "line 1") {
		t.Errorf("malformed file: %v, want the file and the line", err)
	}
}

// watchRecorder is a memstore that records the (scope, key) of every claim
// and every Watch registration, and signals each registration.
type watchRecorder struct {
	*memstore.Store
	mu      sync.Mutex
	claims  map[string]bool
	watches []string
	watched chan struct{}
}

func (s *watchRecorder) Claim(ctx context.Context, p idemstore.ClaimParams) (idemstore.ClaimResult, error) {
	s.mu.Lock()
	s.claims[p.Scope+"\x00"+p.Key] = true
	s.mu.Unlock()
	return s.Store.Claim(ctx, p)
}

func (s *watchRecorder) Watch(ctx context.Context, scope, key string) (<-chan struct{}, error) {
	s.mu.Lock()
	s.watches = append(s.watches, scope+"\x00"+key)
	s.mu.Unlock()
	select {
	case s.watched <- struct{}{}:
	default:
	}
	return s.Store.Watch(ctx, scope, key)
}

// With key hashing, wait mode watches the record under the same hashed
// names the claim used, and the waiting duplicate receives the replay.
func TestEncryptionWaitModeWatchesStoredNames(t *testing.T) {
	t.Parallel()
	ms, _ := memstore.New(nil)
	store := &watchRecorder{Store: ms, claims: map[string]bool{}, watched: make(chan struct{}, 1)}
	enc := newEncryption(t, &idemcrypt.Config{HashKey: testKey("hash")}, "1")
	exec, err := idem.NewExecutor(store, &idem.Config{Encryption: enc, Wait: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	p := idem.DoParams{Scope: idem.Scope("t", "op"), Key: "clear-key", Fingerprint: idem.FingerprintVersion + ":x"}
	running, release := make(chan struct{}), make(chan struct{})
	first := make(chan *idem.Result, 1)
	go func() {
		res, err := exec.Do(t.Context(), p, func(context.Context) (*idem.Response, error) {
			close(running)
			<-release
			return sampleResponse(), nil
		})
		if err != nil {
			t.Error(err)
		}
		first <- res
	}()
	<-running
	second := make(chan *idem.Result, 1)
	go func() {
		res, err := exec.Do(t.Context(), p, func(context.Context) (*idem.Response, error) {
			t.Error("the duplicate executed")
			return nil, nil
		})
		if err != nil {
			t.Error(err)
		}
		second <- res
	}()
	<-store.watched // the duplicate waits on the store's Watcher
	close(release)
	<-first
	res := <-second
	if res == nil || !res.Replayed || res.Response.StatusCode != 201 || !bytes.Equal(res.Response.Body, sampleResponse().Body) {
		t.Fatalf("the waiting duplicate got %+v", res)
	}
	store.mu.Lock()
	defer store.mu.Unlock()
	for _, w := range store.watches {
		if !store.claims[w] {
			t.Errorf("Watch(%q) names no claimed record", w)
		}
		if strings.Contains(w, "clear-key") {
			t.Errorf("Watch was given the clear key: %q", w)
		}
	}
	for c := range store.claims {
		if strings.Contains(c, "clear-key") {
			t.Errorf("Claim was given the clear key: %q", c)
		}
	}
}

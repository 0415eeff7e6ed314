package storetest

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemcrypt"
	"github.com/idemhq/idem/idemstore"
)

// Raw reads and writes what a store holds, bypassing the store: the
// database's own client, as someone with a backup or a database login
// would. RunAtRest uses it to check that encrypted records hold nothing in
// clear and that altered records fail closed.
type Raw interface {
	// Dump returns every byte the store holds for its records (every
	// column of every row, every key name and value, or the database
	// files), in any order.
	Dump(t *testing.T) []byte
	// Response returns the stored response bytes of the record at (scope,
	// key), exactly as the store keeps them, or nil if there is none.
	Response(t *testing.T, scope, key string) []byte
	// SetResponse overwrites the stored response bytes of the record at
	// (scope, key).
	SetResponse(t *testing.T, scope, key string, b []byte)
}

// AtRestHarness tells RunAtRest how to get a store and its raw contents.
type AtRestHarness struct {
	// NewStore returns a fresh, isolated store and raw access to it.
	NewStore func(t *testing.T) (idemstore.Store, Raw)
}

const (
	atRestMarker = "MARKER-4242-4242-4242"
	atRestTenant = "tenant-SECRET"
	atRestOp     = "POST /payments"
)

// RunAtRest checks encryption at rest (idem.Config.Encryption) on a store
// through the middleware, with a payment handler whose response carries a
// marker string:
//
//   - with encryption and key hashing on, the marker, the client's key and
//     the tenant are absent from Raw.Dump, and the replay is byte for byte
//     the first response (and without encryption the marker is present,
//     which shows that Dump sees the data);
//   - a stored ciphertext with one bit flipped, or copied from another
//     record, is answered with 503 idempotency.record_unreadable and the
//     handler does not run again;
//   - rotation: records written under key 1 replay after a restart with keys
//     1 and 2, which writes new records under key 2; after a restart with key
//     2 alone the records under key 1 answer 503 and never run again, and
//     those under key 2 replay;
//   - on a StepStore, recovery points are sealed, bound to their record and
//     never read as plaintext when altered, and records written before
//     encryption are accepted only with AcceptPlaintext (see RawCheckpoints
//     for the cases that alter stored checkpoints).
func RunAtRest(t *testing.T, h AtRestHarness) {
	if h.NewStore == nil {
		t.Fatal("storetest: AtRestHarness.NewStore is nil")
	}
	t.Run("MarkerAbsent", func(t *testing.T) { t.Parallel(); testMarkerAbsent(t, h, true) })
	t.Run("MarkerPresentWithoutEncryption", func(t *testing.T) { t.Parallel(); testMarkerAbsent(t, h, false) })
	t.Run("TamperedFailsClosed", func(t *testing.T) { t.Parallel(); testTampered(t, h, false) })
	t.Run("CopiedFailsClosed", func(t *testing.T) { t.Parallel(); testTampered(t, h, true) })
	t.Run("Rotation", func(t *testing.T) { t.Parallel(); testRotation(t, h) })
	runAtRestSteps(t, h)
}

// atRestKey derives a deterministic 32-byte key from a name.
func atRestKey(name string) []byte {
	k := sha256.Sum256([]byte("storetest key " + name))
	return k[:]
}

// Encryption returns an encryption with one key and key hashing, for a
// store's TestConformanceEncrypted (Harness.Encryption).
func Encryption(t *testing.T) *idemcrypt.Encryption {
	t.Helper()
	return atRestEncryption(t, true, "1")
}

func atRestEncryption(t *testing.T, hash bool, ids ...string) *idemcrypt.Encryption {
	t.Helper()
	keys := make([]idemcrypt.Key, len(ids))
	for i, id := range ids {
		keys[i] = idemcrypt.Key{ID: id, Key: atRestKey(id)}
	}
	kr, err := idemcrypt.NewKeyring(keys...)
	if err != nil {
		t.Fatal(err)
	}
	var cfg idemcrypt.Config
	if hash {
		cfg.HashKey = atRestKey("hash")
	}
	enc, err := idemcrypt.New(kr, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	return enc
}

// paymentServer is one "process" in front of store: the middleware with
// enc and a handler that counts its executions.
type paymentServer struct {
	url  string
	runs *atomic.Int64
	enc  *idemcrypt.Encryption
}

func newPaymentServer(t *testing.T, store idemstore.Store, enc *idemcrypt.Encryption, runs *atomic.Int64) *paymentServer {
	t.Helper()
	mw, err := idem.NewMiddleware(store, &idem.Config{
		Encryption:    enc,
		FailOpen:      true, // an unreadable record must not fall through to the handler
		TenantFunc:    func(r *http.Request) (string, error) { return atRestTenant, nil },
		OperationFunc: func(*http.Request) string { return atRestOp },
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(mw.Handle(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := runs.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Card", atRestMarker)
		w.Header().Add("X-Multi", "a")
		w.Header().Add("X-Multi", "b")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":"pay_%d","card":%q,"bytes":"\u00e9\u0000"}`, n, atRestMarker)
	})))
	t.Cleanup(srv.Close)
	return &paymentServer{url: srv.URL, runs: runs, enc: enc}
}

// reply is what a client saw: the status, the header fields idem does not
// set per response, and the body.
type reply struct {
	status int
	header http.Header
	body   []byte
	code   string
}

func (r reply) String() string {
	return fmt.Sprintf("%d %s %q", r.status, r.code, r.body)
}

func (s *paymentServer) pay(t *testing.T, key string) reply {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, s.url+"/payments", strings.NewReader(`{"amount":100}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(idem.HeaderKey, `"`+key+`"`)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	h := resp.Header.Clone()
	for _, k := range []string{"Date", idem.HeaderReplayed, idem.HeaderExpiresAt} {
		h.Del(k)
	}
	r := reply{status: resp.StatusCode, header: h, body: body}
	if resp.StatusCode >= 400 {
		var p struct{ Code string }
		_ = json.Unmarshal(body, &p)
		r.code = p.Code
	}
	return r
}

func (s *paymentServer) stored(key string) (string, string) {
	return s.enc.StoredKey(idem.Scope(atRestTenant, atRestOp), key)
}

func sameReply(a, b reply) bool {
	if a.status != b.status || !bytes.Equal(a.body, b.body) || len(a.header) != len(b.header) {
		return false
	}
	for k, vs := range a.header {
		if strings.Join(b.header[k], "\x00") != strings.Join(vs, "\x00") {
			return false
		}
	}
	return true
}

func testMarkerAbsent(t *testing.T, h AtRestHarness, encrypted bool) {
	store, raw := h.NewStore(t)
	var enc *idemcrypt.Encryption
	if encrypted {
		enc = atRestEncryption(t, true, "1")
	}
	var runs atomic.Int64
	srv := newPaymentServer(t, store, enc, &runs)
	const key = "order-SECRET-1001"
	first := srv.pay(t, key)
	again := srv.pay(t, key)
	if first.status != http.StatusCreated || runs.Load() != 1 {
		t.Fatalf("first %v, again %v, %d executions", first, again, runs.Load())
	}
	if !sameReply(first, again) {
		t.Fatalf("the replay differs:\nfirst %v %v\nagain %v %v", first, first.header, again, again.header)
	}
	dump := raw.Dump(t)
	if !encrypted {
		if !bytes.Contains(dump, []byte(atRestMarker)) {
			t.Fatalf("without encryption the marker is not in the %d bytes Dump returned: Dump does not see the records", len(dump))
		}
		return
	}
	for _, s := range []string{atRestMarker, key, atRestTenant} {
		if bytes.Contains(dump, []byte(s)) {
			t.Errorf("%q is stored in clear", s)
		}
	}
	if scope, k := srv.stored(key); raw.Response(t, scope, k) == nil {
		t.Errorf("no stored response at the hashed (scope, key)")
	}
}

func testTampered(t *testing.T, h AtRestHarness, copied bool) {
	store, raw := h.NewStore(t)
	var runs atomic.Int64
	srv := newPaymentServer(t, store, atRestEncryption(t, true, "1"), &runs)
	a := srv.pay(t, "a")
	b := srv.pay(t, "b")
	if a.status != http.StatusCreated || b.status != http.StatusCreated {
		t.Fatalf("a %v, b %v", a, b)
	}
	sa, ka := srv.stored("a")
	sb, kb := srv.stored("b")
	if copied {
		raw.SetResponse(t, sb, kb, raw.Response(t, sa, ka))
	} else {
		stored := bytes.Clone(raw.Response(t, sb, kb))
		if len(stored) == 0 {
			t.Fatal("no stored response")
		}
		stored[len(stored)-5] ^= 0x01 // in the ciphertext's tag
		raw.SetResponse(t, sb, kb, stored)
	}
	for range 2 {
		if r := srv.pay(t, "b"); r.status != http.StatusServiceUnavailable || r.code != idem.CodeRecordUnreadable {
			t.Fatalf("altered record: %v, want 503 %s", r, idem.CodeRecordUnreadable)
		}
	}
	if r := srv.pay(t, "a"); !sameReply(r, a) {
		t.Fatalf("untouched record: %v, want %v", r, a)
	}
	if runs.Load() != 2 {
		t.Fatalf("%d executions, want 2", runs.Load())
	}
}

func testRotation(t *testing.T, h AtRestHarness) {
	store, _ := h.NewStore(t)
	var runs atomic.Int64
	v1 := newPaymentServer(t, store, atRestEncryption(t, false, "1"), &runs)
	old := v1.pay(t, "old")

	v12 := newPaymentServer(t, store, atRestEncryption(t, false, "1", "2"), &runs)
	if r := v12.pay(t, "old"); !sameReply(r, old) {
		t.Fatalf("keys 1+2, record under 1: %v, want %v", r, old)
	}
	fresh := v12.pay(t, "new")
	if fresh.status != http.StatusCreated || runs.Load() != 2 {
		t.Fatalf("keys 1+2, new record: %v (%d executions)", fresh, runs.Load())
	}

	v2 := newPaymentServer(t, store, atRestEncryption(t, false, "2"), &runs)
	if r := v2.pay(t, "old"); r.status != http.StatusServiceUnavailable || r.code != idem.CodeRecordUnreadable {
		t.Fatalf("key 2 only, record under 1: %v, want 503 %s", r, idem.CodeRecordUnreadable)
	}
	if r := v2.pay(t, "new"); !sameReply(r, fresh) {
		t.Fatalf("key 2 only, record under 2: %v, want %v", r, fresh)
	}
	// The new record is under key 2: key 1 alone cannot read it.
	if r := v1.pay(t, "new"); r.status != http.StatusServiceUnavailable {
		t.Fatalf("key 1 only, record under 2: %v, want 503", r)
	}
	if runs.Load() != 2 {
		t.Fatalf("%d executions, want 2", runs.Load())
	}
}

package storetest

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemcrypt"
	"github.com/idemhq/idem/idemstore"
)

// RawCheckpoints is implemented by the Raw of a store that keeps recovery
// points (idemstore.StepStore), so that RunAtRest can alter them as someone with
// write access to the database would. Without it, RunAtRest still checks
// that checkpoints are sealed (through Raw.Dump) and skips the tampering
// cases.
type RawCheckpoints interface {
	// Checkpoint returns the stored checkpoint bytes of the record at
	// (scope, key), exactly as the store keeps them, or nil if there is
	// none.
	Checkpoint(t *testing.T, scope, key string) []byte
	// SetCheckpoint overwrites the stored checkpoint bytes of the record
	// at (scope, key).
	SetCheckpoint(t *testing.T, scope, key string, b []byte)
}

// runAtRestSteps checks sealed recovery points on a StepStore, through the
// Executor and a three-step operation (payment, charge, capture) whose step
// data carry a marker:
//
//   - with encryption and key hashing on, the marker, the client's key and
//     the tenant are absent from Raw.Dump while the operation is suspended
//     at its recovery point, the stored checkpoint is not JSON, and the
//     next attempt resumes after the completed steps (without encryption
//     the marker is present, which shows that Dump sees checkpoints);
//   - a stored checkpoint with one bit flipped, copied from another record,
//     or replaced by one in clear is answered with ErrRecordUnreadable (and
//     AcceptPlaintext does not change that for the altered seal); no step
//     runs again, the next attempt is not held up by a lease, and Reconcile
//     reports the record as failed without calling its resume function;
//   - records written before encryption was turned on (a completed one, one
//     suspended at a recovery point in clear) answer ErrRecordUnreadable
//     without AcceptPlaintext; with it, the completed one replays and the
//     suspended one resumes, and the checkpoint it saves then is sealed.
func runAtRestSteps(t *testing.T, h AtRestHarness) {
	t.Run("CheckpointMarkerAbsent", func(t *testing.T) { t.Parallel(); testCheckpointMarker(t, h, true) })
	t.Run("CheckpointMarkerPresentWithoutEncryption", func(t *testing.T) { t.Parallel(); testCheckpointMarker(t, h, false) })
	t.Run("CheckpointTamperedFailsClosed", func(t *testing.T) { t.Parallel(); testCheckpointTampered(t, h) })
	t.Run("PlaintextAccepted", func(t *testing.T) { t.Parallel(); testPlaintextAccepted(t, h) })
}

// stepFlow is a three-step operation whose steps count their runs and can
// be made to fail with an unknown outcome, as a provider that timed out.
type stepFlow struct {
	marker                      string
	payments, charges, captures atomic.Int64
	failCharge, failCapture     atomic.Bool
	paymentData, chargeData     []byte
}

var errProviderTimeout = fmt.Errorf("storetest: the provider did not answer: %w", idem.ErrOutcomeUnknown)

func newStepFlow(marker string) *stepFlow {
	return &stepFlow{marker: marker,
		paymentData: []byte(`{"amountCents":4200,"currency":"EUR","reference":"` + marker + `-ref"}`),
		chargeData:  []byte(`{"chargeId":"` + marker + `-charge"}`)}
}

func (f *stepFlow) op(ctx context.Context) (*idemstore.Response, error) {
	pay, err := idem.Step(ctx, "payment", func(ctx context.Context) ([]byte, error) {
		f.payments.Add(1)
		// On a transactional store the recovery point then commits in the
		// operation's transaction (idemstore.CheckpointTx).
		if _, err := idem.TxFromContext(ctx); err != nil && !errors.Is(err, idem.ErrNoTx) {
			return nil, err
		}
		return f.paymentData, nil
	})
	if err != nil {
		return nil, err
	}
	charge, err := idem.Step(ctx, "charge", func(ctx context.Context) ([]byte, error) {
		f.charges.Add(1)
		if f.failCharge.Load() {
			return nil, errProviderTimeout
		}
		return f.chargeData, nil
	})
	if err != nil {
		return nil, err
	}
	if _, err := idem.Step(ctx, "capture", func(ctx context.Context) ([]byte, error) {
		f.captures.Add(1)
		if f.failCapture.Load() {
			return nil, errProviderTimeout
		}
		return []byte("ok"), nil
	}); err != nil {
		return nil, err
	}
	return &idemstore.Response{StatusCode: 201, Body: append(append(bytes.Clone(pay), ' '), charge...)}, nil
}

func (f *stepFlow) runs() [3]int64 {
	return [3]int64{f.payments.Load(), f.charges.Load(), f.captures.Load()}
}

// stepRunner runs stepFlow operations through an Executor on store.
type stepRunner struct {
	t     *testing.T
	store idemstore.Store
	exec  *idem.Executor
	enc   *idemcrypt.Encryption
}

const stepsOp = "POST /payments (steps)"

func newStepRunner(t *testing.T, store idemstore.Store, enc *idemcrypt.Encryption) *stepRunner {
	t.Helper()
	exec, err := idem.NewExecutor(store, &idem.Config{Encryption: enc,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	return &stepRunner{t: t, store: store, exec: exec, enc: enc}
}

func (r *stepRunner) params(key string) idem.DoParams {
	return idem.DoParams{Scope: idem.Scope(atRestTenant, stepsOp), Key: key,
		Fingerprint: idem.FingerprintVersion + ":" + fmt.Sprintf("%064x", len(key)), Operation: stepsOp}
}

func (r *stepRunner) do(key string, f *stepFlow) (*idem.Result, error) {
	return r.exec.Do(r.t.Context(), r.params(key), f.op)
}

// suspend runs f for key with its charge failing: the operation stops
// after the payment step, at its recovery point.
func (r *stepRunner) suspend(key string, f *stepFlow) {
	r.t.Helper()
	f.failCharge.Store(true)
	defer f.failCharge.Store(false)
	res, err := r.do(key, f)
	if !errors.Is(err, idem.ErrOutcomeUnknown) || !res.Suspended {
		r.t.Fatalf("%s: Do with a failing charge: suspended %v, %v; want suspended with ErrOutcomeUnknown", key, res.Suspended, err)
	}
}

// complete runs f for key and wants a stored response.
func (r *stepRunner) complete(key string, f *stepFlow) *idemstore.Response {
	r.t.Helper()
	res, err := r.do(key, f)
	if err != nil || res.Response == nil || res.Response.StatusCode != 201 || res.Suspended || res.Released {
		r.t.Fatalf("%s: Do: %+v, %v; want a stored 201", key, res, err)
	}
	return res.Response
}

// unreadable runs f for key and wants ErrRecordUnreadable, no step run and
// no claim held afterwards.
func (r *stepRunner) unreadable(key string, f *stepFlow, why string) {
	r.t.Helper()
	before := f.runs()
	for range 2 { // the second attempt is not held up by the first one's lease
		if _, err := r.do(key, f); !errors.Is(err, idem.ErrRecordUnreadable) {
			r.t.Fatalf("%s (%s): Do: %v, want ErrRecordUnreadable", key, why, err)
		}
	}
	if after := f.runs(); after != before {
		r.t.Fatalf("%s (%s): steps ran (payment, charge, capture runs %v, then %v)", key, why, before, after)
	}
}

// stored returns the raw checkpoint of key's record, or nil without
// RawCheckpoints.
func (r *stepRunner) stored(raw Raw, key string) []byte {
	rc, ok := raw.(RawCheckpoints)
	if !ok {
		return nil
	}
	p := r.params(key)
	scope, k := r.enc.StoredKey(p.Scope, p.Key)
	return rc.Checkpoint(r.t, scope, k)
}

func (r *stepRunner) setStored(raw Raw, key string, b []byte) {
	p := r.params(key)
	scope, k := r.enc.StoredKey(p.Scope, p.Key)
	raw.(RawCheckpoints).SetCheckpoint(r.t, scope, k, b)
}

func stepStoreOrSkip(t *testing.T, h AtRestHarness) (idemstore.Store, Raw) {
	t.Helper()
	store, raw := h.NewStore(t)
	if _, ok := store.(idemstore.StepStore); !ok {
		t.Skip("the store does not implement idemstore.StepStore")
	}
	return store, raw
}

func testCheckpointMarker(t *testing.T, h AtRestHarness, encrypted bool) {
	store, raw := stepStoreOrSkip(t, h)
	var enc *idemcrypt.Encryption
	if encrypted {
		enc = atRestEncryption(t, true, "1")
	}
	r := newStepRunner(t, store, enc)
	const key = "order-SECRET-2002"
	f := newStepFlow(atRestMarker)
	r.suspend(key, f)
	dump := raw.Dump(t)
	// A checkpoint in clear is JSON, with step data in base64.
	data := base64.StdEncoding.EncodeToString(f.paymentData)
	if !encrypted {
		if !bytes.Contains(dump, []byte(data)) {
			t.Fatalf("without encryption the payment step's data is not in the %d bytes Dump returned: Dump does not see the checkpoints", len(dump))
		}
		return
	}
	for _, s := range []string{data, atRestMarker, key, atRestTenant, `"payment"`} {
		if bytes.Contains(dump, []byte(s)) {
			t.Errorf("%q is stored in clear while the operation is at its recovery point", s)
		}
	}
	if cp := r.stored(raw, key); cp != nil && (len(cp) == 0 || cp[0] == '{') {
		t.Errorf("the stored checkpoint is in clear: %q", cp)
	}
	// The next attempt resumes after the payment step.
	resp := r.complete(key, f)
	if got := f.runs(); got != [3]int64{1, 2, 1} {
		t.Errorf("payment, charge, capture ran %v times, want [1 2 1]", got)
	}
	if !bytes.Contains(resp.Body, f.paymentData) {
		t.Errorf("the resumed operation's response %q lacks the payment step's data", resp.Body)
	}
	if cp := r.stored(raw, key); cp != nil {
		t.Errorf("the completed record still holds its checkpoint (%d bytes)", len(cp))
	}
	res, err := r.do(key, f)
	if err != nil || !res.Replayed || !bytes.Equal(res.Response.Body, resp.Body) {
		t.Fatalf("retry after completion: %+v, %v; want the replay", res, err)
	}
}

func testCheckpointTampered(t *testing.T, h AtRestHarness) {
	store, raw := stepStoreOrSkip(t, h)
	if _, ok := raw.(RawCheckpoints); !ok {
		t.Skip("the store's Raw does not implement storetest.RawCheckpoints")
	}
	// No key hashing, so that Reconcile can run.
	enc := atRestEncryption(t, false, "1")
	r := newStepRunner(t, store, enc)
	flows := map[string]*stepFlow{}
	for _, k := range []string{"good", "flipped", "copied", "plain"} {
		flows[k] = newStepFlow(atRestMarker + "-" + k)
		r.suspend(k, flows[k])
	}
	good := r.stored(raw, "good")
	flipped := bytes.Clone(r.stored(raw, "flipped"))
	flipped[len(flipped)-3] ^= 0x01 // in the tag
	r.setStored(raw, "flipped", flipped)
	r.setStored(raw, "copied", good)
	r.setStored(raw, "plain", []byte(`{"v":1,"steps":[{"name":"payment","done":true,"data":"e30="}]}`))

	r.unreadable("flipped", flows["flipped"], "one bit flipped")
	r.unreadable("copied", flows["copied"], "copied from another record")
	r.unreadable("plain", flows["plain"], "replaced by a checkpoint in clear")
	lenient := newStepRunner(t, store, atRestEncryptionWith(t, &idemcrypt.Config{AcceptPlaintext: true}, "1"))
	lenient.unreadable("flipped", flows["flipped"], "one bit flipped, with AcceptPlaintext")
	// The altered records keep what was stored, so that a restored key
	// (or an investigation) still finds it.
	if !bytes.Equal(r.stored(raw, "flipped"), flipped) {
		t.Error("the unreadable checkpoint was rewritten")
	}

	resumed := map[string]bool{}
	res, err := r.exec.Reconcile(t.Context(), idem.ReconcileParams{Operation: stepsOp}, func(_ context.Context, rec idemstore.StuckRecord) (idem.Operation, error) {
		resumed[rec.Key] = true
		steps, err := idem.ParseCheckpoint(rec.Checkpoint)
		if err != nil || len(steps) != 2 || steps[0].Name != "payment" || !bytes.Equal(steps[0].Data, flows[rec.Key].paymentData) {
			return nil, fmt.Errorf("the resume function got checkpoint %q: %v, %v", rec.Checkpoint, steps, err)
		}
		return flows[rec.Key].op, nil
	})
	if res.Found != 4 || res.Completed != 1 || res.Failed != 3 || !errors.Is(err, idem.ErrRecordUnreadable) {
		t.Errorf("Reconcile: %+v, %v; want 4 found, 1 completed, 3 failed with ErrRecordUnreadable", res, err)
	}
	if len(resumed) != 1 || !resumed["good"] {
		t.Errorf("Reconcile called resume for %v, want only the readable record", resumed)
	}
	if got := flows["good"].runs(); got != [3]int64{1, 2, 1} {
		t.Errorf("the readable record's steps ran %v times, want [1 2 1]", got)
	}
}

func testPlaintextAccepted(t *testing.T, h AtRestHarness) {
	store, raw := stepStoreOrSkip(t, h)
	done, pending := newStepFlow(atRestMarker+"-done"), newStepFlow(atRestMarker+"-pending")
	// Before encryption: one completed record, one at a recovery point.
	before := newStepRunner(t, store, nil)
	first := before.complete("done", done)
	before.suspend("pending", pending)

	sealed := atRestEncryption(t, false, "1")
	strict := newStepRunner(t, store, sealed)
	strict.unreadable("done", done, "completed in clear, AcceptPlaintext off")
	strict.unreadable("pending", pending, "recovery point in clear, AcceptPlaintext off")

	lenient := newStepRunner(t, store, atRestEncryptionWith(t, &idemcrypt.Config{AcceptPlaintext: true}, "1"))
	res, err := lenient.do("done", done)
	if err != nil || !res.Replayed || !bytes.Equal(res.Response.Body, first.Body) {
		t.Fatalf("completed in clear, AcceptPlaintext: %+v, %v; want the replay", res, err)
	}
	// The record in clear resumes after its payment step; its charge is
	// recorded under a new marker, and then the capture fails.
	pending.chargeData = []byte(`{"chargeId":"` + atRestMarker + `-sealed-charge"}`)
	pending.failCapture.Store(true)
	if res, err := lenient.do("pending", pending); !errors.Is(err, idem.ErrOutcomeUnknown) || !res.Suspended {
		t.Fatalf("recovery point in clear, AcceptPlaintext: suspended %v, %v; want suspended again at the capture", res.Suspended, err)
	}
	if got := pending.runs(); got != [3]int64{1, 2, 1} {
		t.Errorf("payment, charge, capture ran %v times, want [1 2 1]", got)
	}
	if bytes.Contains(raw.Dump(t), []byte(base64.StdEncoding.EncodeToString(pending.chargeData))) {
		t.Error("the checkpoint saved with AcceptPlaintext is stored in clear")
	}
	if cp := lenient.stored(raw, "pending"); cp != nil && cp[0] == '{' {
		t.Errorf("the checkpoint saved with AcceptPlaintext is in clear: %q", cp)
	}
	// Sealed now, it resumes without AcceptPlaintext too.
	pending.failCapture.Store(false)
	resp := strict.complete("pending", pending)
	if got := pending.runs(); got != [3]int64{1, 2, 2} || !bytes.Contains(resp.Body, pending.chargeData) {
		t.Errorf("after the capture: runs %v, response %q; want [1 2 2] and the recorded charge", got, resp.Body)
	}
	// The completed record in clear is still refused without the option.
	strict.unreadable("done", done, "completed in clear, AcceptPlaintext off again")
}

func atRestEncryptionWith(t *testing.T, cfg *idemcrypt.Config, ids ...string) *idemcrypt.Encryption {
	t.Helper()
	keys := make([]idemcrypt.Key, len(ids))
	for i, id := range ids {
		keys[i] = idemcrypt.Key{ID: id, Key: atRestKey(id)}
	}
	kr, err := idemcrypt.NewKeyring(keys...)
	if err != nil {
		t.Fatal(err)
	}
	enc, err := idemcrypt.New(kr, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return enc
}

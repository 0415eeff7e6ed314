package idem_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemcrypt"
	"github.com/idemhq/idem/memstore"
)

func sampleCheckpoint() []byte {
	return []byte(`{"v":1,"steps":[{"name":"payment","done":true,"data":"TUFSS0VSLTQyNDI="},{"name":"charge","unknown":true}]}`)
}

func TestSealOpenCheckpoint(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	enc := newEncryption(t, nil, "1")
	scope, key, fp := idem.Scope("tenant-a", "POST /payments"), "k1", idem.FingerprintVersion+":aaaa"
	want := sampleCheckpoint()
	sealed, err := enc.SealCheckpoint(ctx, scope, key, fp, want)
	if err != nil {
		t.Fatal(err)
	}
	for _, secret := range []string{"payment", "TUFSS0VSLTQyNDI=", "MARKER"} {
		if bytes.Contains(sealed, []byte(secret)) {
			t.Errorf("sealed checkpoint contains %q", secret)
		}
	}
	if sealed[0] == '{' {
		t.Fatal("a sealed checkpoint starts like one in clear")
	}
	if _, err := idem.ParseCheckpoint(sealed); !errors.Is(err, idem.ErrRecordUnreadable) {
		t.Errorf("ParseCheckpoint of a sealed checkpoint: %v, want ErrRecordUnreadable", err)
	}
	got, err := enc.OpenCheckpoint(ctx, scope, key, fp, sealed)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("round trip: %q, %v", got, err)
	}
	if again, _ := enc.SealCheckpoint(ctx, scope, key, fp, want); bytes.Equal(again, sealed) {
		t.Error("two seals are identical")
	}
	if n := len(sealed) - len(want); n > 120 {
		t.Errorf("sealing adds %d bytes", n)
	}

	t.Run("OtherRecord", func(t *testing.T) {
		for _, c := range []struct{ scope, key, fp string }{
			{scope, "k2", fp}, {idem.Scope("tenant-b", "POST /payments"), key, fp}, {scope, key, idem.FingerprintVersion + ":bbbb"},
		} {
			if _, err := enc.OpenCheckpoint(ctx, c.scope, c.key, c.fp, sealed); !errors.Is(err, idem.ErrRecordUnreadable) || !errors.Is(err, idemcrypt.ErrDecrypt) {
				t.Errorf("OpenCheckpoint under (%q, %q, %q): %v, want ErrRecordUnreadable and ErrDecrypt", c.scope, c.key, c.fp, err)
			}
		}
	})
	t.Run("ResponseSealIsNoCheckpoint", func(t *testing.T) {
		// The same record's sealed response, in the checkpoint's column.
		r, err := enc.Seal(ctx, scope, key, sampleResponse())
		if err != nil {
			t.Fatal(err)
		}
		b, _ := r.MarshalBinary()
		if _, err := enc.OpenCheckpoint(ctx, scope, key, fp, b); !errors.Is(err, idem.ErrRecordUnreadable) {
			t.Errorf("a sealed response opened as a checkpoint: %v", err)
		}
	})
	t.Run("EveryByteTampered", func(t *testing.T) {
		lenient := newEncryption(t, &idemcrypt.Config{AcceptPlaintext: true}, "1")
		for i := range sealed {
			for _, bit := range []byte{0x01, 0x80} {
				b := bytes.Clone(sealed)
				b[i] ^= bit
				for _, e := range []*idemcrypt.Encryption{enc, lenient} {
					if got, err := e.OpenCheckpoint(ctx, scope, key, fp, b); !errors.Is(err, idem.ErrRecordUnreadable) || got != nil {
						t.Fatalf("stored byte %d ^ %#x: %q, %v", i, bit, got, err)
					}
				}
			}
		}
		for n := 1; n < len(sealed); n++ {
			if _, err := lenient.OpenCheckpoint(ctx, scope, key, fp, sealed[:n]); !errors.Is(err, idem.ErrRecordUnreadable) {
				t.Fatalf("truncated to %d bytes: %v", n, err)
			}
		}
	})
	t.Run("UnknownKeyID", func(t *testing.T) {
		other := newEncryption(t, nil, "2")
		if _, err := other.OpenCheckpoint(ctx, scope, key, fp, sealed); !errors.Is(err, idemcrypt.ErrUnknownKeyID) || !errors.Is(err, idem.ErrRecordUnreadable) {
			t.Fatalf("OpenCheckpoint with a keyring without key 1: %v", err)
		}
		rotated := newEncryption(t, nil, "1", "2")
		if got, err := rotated.OpenCheckpoint(ctx, scope, key, fp, sealed); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("OpenCheckpoint with keys 1+2: %v", err)
		}
	})
	t.Run("EncryptionOff", func(t *testing.T) {
		var off *idemcrypt.Encryption
		if _, err := off.OpenCheckpoint(ctx, scope, key, fp, sealed); !errors.Is(err, idem.ErrRecordUnreadable) {
			t.Fatalf("OpenCheckpoint of a sealed checkpoint without keys: %v", err)
		}
		if got, err := off.OpenCheckpoint(ctx, scope, key, fp, want); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("OpenCheckpoint of a checkpoint in clear without keys: %q, %v", got, err)
		}
		if got, err := off.SealCheckpoint(ctx, scope, key, fp, want); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("SealCheckpoint without keys: %q, %v", got, err)
		}
	})
	t.Run("Plaintext", func(t *testing.T) {
		if _, err := enc.OpenCheckpoint(ctx, scope, key, fp, want); !errors.Is(err, idem.ErrRecordUnreadable) {
			t.Fatalf("checkpoint in clear with encryption on: %v", err)
		}
		lenient := newEncryption(t, &idemcrypt.Config{AcceptPlaintext: true}, "1")
		if got, err := lenient.OpenCheckpoint(ctx, scope, key, fp, want); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("checkpoint in clear with AcceptPlaintext: %q, %v", got, err)
		}
		if got, err := enc.OpenCheckpoint(ctx, scope, key, fp, nil); err != nil || got != nil {
			t.Fatalf("empty checkpoint: %q, %v", got, err)
		}
	})
}

// AcceptPlaintext with HashKey would look records written in clear up
// under digests that never find them, and run their retries again.
func TestAcceptPlaintextWithHashKeyRefused(t *testing.T) {
	t.Parallel()
	kr, _ := idemcrypt.NewKeyring(idemcrypt.Key{ID: "1", Key: testKey("1")})
	_, err := idemcrypt.New(kr, &idemcrypt.Config{AcceptPlaintext: true, HashKey: testKey("hash")})
	if err == nil || !bytes.Contains([]byte(err.Error()), []byte("HashKey")) {
		t.Fatalf("AcceptPlaintext with HashKey: %v, want an error naming HashKey", err)
	}
	for _, cfg := range []*idemcrypt.Config{{AcceptPlaintext: true}, {HashKey: testKey("hash")}} {
		if _, err := idemcrypt.New(kr, cfg); err != nil {
			t.Errorf("%+v: %v", cfg, err)
		}
	}
}

// FuzzOpenCheckpoint: stored bytes of any content open only if they are a
// real seal (to what was sealed), or a checkpoint in clear where clear is
// accepted; anything else is ErrRecordUnreadable, never a panic.
func FuzzOpenCheckpoint(f *testing.F) {
	enc := newEncryption(f, nil, "1")
	lenient := newEncryption(f, &idemcrypt.Config{AcceptPlaintext: true}, "1")
	sealed, err := enc.SealCheckpoint(context.Background(), "s", "k", "v1:f", sampleCheckpoint())
	if err != nil {
		f.Fatal(err)
	}
	f.Add(sealed)
	f.Add(sampleCheckpoint())
	f.Add([]byte("\x00idemcp1"))
	f.Add([]byte("\x00idemcp1\x01\x31\x00"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, e := range []*idemcrypt.Encryption{enc, lenient} {
			got, err := e.OpenCheckpoint(context.Background(), "s", "k", "v1:f", b)
			switch {
			case err != nil:
				if got != nil || !errors.Is(err, idem.ErrRecordUnreadable) {
					t.Fatalf("OpenCheckpoint: %q, %v", got, err)
				}
			case len(b) == 0:
				if got != nil {
					t.Fatalf("empty: %q", got)
				}
			case b[0] == '{':
				if e == enc || !bytes.Equal(got, b) {
					t.Fatalf("checkpoint in clear %q opened to %q", b, got)
				}
			default:
				if !bytes.Equal(got, sampleCheckpoint()) {
					t.Fatalf("forged seal %q opened to %q", b, got)
				}
			}
		}
	})
}

// Through the middleware on memstore: a payment stopped at its recovery
// point resumes after a restart with the same keys (and after a rotation);
// a restart without the sealing key answers 503 record_unreadable, runs no
// step, and does not hold the key for a lease.
func TestRecoveryPointSealedThroughMiddleware(t *testing.T) {
	t.Parallel()
	store, err := memstore.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	var payments, charges atomic.Int64
	var failCharge atomic.Bool
	failCharge.Store(true)
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ref, err := idem.Step(r.Context(), "payment", func(context.Context) ([]byte, error) {
			payments.Add(1)
			return []byte("order-SECRET-9"), nil
		})
		if err == nil {
			_, err = idem.Step(r.Context(), "charge", func(context.Context) ([]byte, error) {
				charges.Add(1)
				if failCharge.Load() {
					return nil, fmt.Errorf("provider: %w", idem.ErrOutcomeUnknown)
				}
				return []byte("ch_1"), nil
			})
		}
		if err != nil {
			http.Error(w, "retry", http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "paid %s", ref)
	})
	serve := func(enc *idemcrypt.Encryption) string {
		mw, err := idem.NewMiddleware(store, &idem.Config{Encryption: enc, FailOpen: true,
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(mw.Handle(handler))
		t.Cleanup(srv.Close)
		return srv.URL
	}
	post := func(url string) (int, string, string) {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, url, strings.NewReader(`{"amount":1}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(idem.HeaderKey, `"pay-1"`)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var p struct{ Code string }
		_ = json.Unmarshal(b, &p)
		return resp.StatusCode, p.Code, string(b)
	}

	if code, _, body := post(serve(newEncryption(t, nil, "1"))); code != http.StatusServiceUnavailable || payments.Load() != 1 {
		t.Fatalf("first attempt: %d %s, %d payments", code, body, payments.Load())
	}
	other := serve(newEncryption(t, nil, "2"))
	for range 2 {
		if code, pc, body := post(other); code != http.StatusServiceUnavailable || pc != idem.CodeRecordUnreadable {
			t.Fatalf("without the sealing key: %d %s, want 503 %s", code, body, idem.CodeRecordUnreadable)
		}
	}
	if payments.Load() != 1 || charges.Load() != 1 {
		t.Fatalf("a step ran without its recovery point: %d payments, %d charges", payments.Load(), charges.Load())
	}
	failCharge.Store(false)
	if code, _, body := post(serve(newEncryption(t, nil, "1", "2"))); code != http.StatusCreated || body != "paid order-SECRET-9" {
		t.Fatalf("resumed with keys 1+2: %d %s", code, body)
	}
	if payments.Load() != 1 || charges.Load() != 2 {
		t.Fatalf("after the resumption: %d payments, %d charges; want 1, 2", payments.Load(), charges.Load())
	}
}

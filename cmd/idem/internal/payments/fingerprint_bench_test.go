package payments

import (
	"net/http"
	"strings"
	"testing"

	"github.com/idemhq/idem"
)

// BenchmarkFingerprint measures the middleware's FingerprintFunc on the
// typical payment request, as every POST (replays included) runs it: the
// frozen old implementation against the current one.
func BenchmarkFingerprint(b *testing.B) {
	body := []byte(`{"amountCents":2599,"currency":"USD","reference":"order-1001"}`)
	r, err := http.NewRequest(http.MethodPost, "/api/payments", strings.NewReader(string(body)))
	if err != nil {
		b.Fatal(err)
	}
	r.Header.Set("Content-Type", "application/json")
	for _, impl := range []struct {
		name string
		fp   func(*http.Request, []byte) ([]byte, error)
	}{{"old", fingerprintOld}, {"new", Fingerprint}} {
		b.Run(impl.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := impl.fp(r, body); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkValidate measures Validate alone on the typical request (the
// handler's path outside the middleware), old against new.
func BenchmarkValidate(b *testing.B) {
	body := []byte(`{"amountCents":2599,"currency":"USD","reference":"order-1001"}`)
	for _, impl := range []struct {
		name     string
		validate func([]byte) (normalised, *idem.Problem)
	}{{"old", validateOld}, {"new", Validate}} {
		b.Run(impl.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, p := impl.validate(body); p != nil {
					b.Fatal(p)
				}
			}
		})
	}
}

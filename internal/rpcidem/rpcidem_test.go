package rpcidem

import (
	"errors"
	"fmt"
	"testing"

	"github.com/idemhq/idem"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The fingerprint is part of the record format: idemgrpc's first release
// wrote records under it, and idemconnect's retries must match them. This
// value was computed by idemgrpc v0.2.0 for this call.
func TestFingerprintIsStable(t *testing.T) {
	fp, err := Fingerprint("/idemtest.Orders/Create", []byte("\n\x05alice"))
	if err != nil {
		t.Fatal(err)
	}
	if want := "v1:7aba56b0882a84d4e3edb7bf8e4747e62c7d6332c40b0eafdaebd66b264fb2d5"; fp != want {
		t.Errorf("fingerprint %s, want %s", fp, want)
	}
	other, _ := Fingerprint("/idemtest.Orders/Cancel", []byte("\n\x05alice"))
	body, _ := Fingerprint("/idemtest.Orders/Create", []byte("\n\x03bob"))
	if other == fp || body == fp {
		t.Error("another procedure or message has the same fingerprint")
	}
}

func TestDefaultStoredAndHTTPStatus(t *testing.T) {
	stored := map[Code]bool{OK: true, InvalidArgument: true, NotFound: true, AlreadyExists: true,
		PermissionDenied: true, FailedPrecondition: true, OutOfRange: true, Unauthenticated: true}
	status := map[Code]int{OK: 200, Canceled: 499, Unknown: 500, InvalidArgument: 400, DeadlineExceeded: 504,
		NotFound: 404, AlreadyExists: 409, PermissionDenied: 403, ResourceExhausted: 429, FailedPrecondition: 400,
		Aborted: 409, OutOfRange: 400, Unimplemented: 501, Internal: 500, Unavailable: 503, DataLoss: 500,
		Unauthenticated: 401}
	for c := OK; c <= Unauthenticated; c++ {
		if DefaultStored(c) != stored[c] {
			t.Errorf("DefaultStored(%d) = %v", c, DefaultStored(c))
		}
		if HTTPStatus(c) != status[c] {
			t.Errorf("HTTPStatus(%d) = %d, want %d", c, HTTPStatus(c), status[c])
		}
	}
	// A stored error must be stored by the executor's default policy too.
	for c := OK; c <= Unauthenticated; c++ {
		if DefaultStored(c) && idem.DefaultOutcome(HTTPStatus(c)) != idem.OutcomeStore {
			t.Errorf("code %d is stored, but the executor releases its status %d", c, HTTPStatus(c))
		}
	}
}

func TestExecAnswer(t *testing.T) {
	for _, tc := range []struct {
		err    error
		code   Code
		reason string
		retry  bool
	}{
		{idem.ErrInFlight, Aborted, idem.CodeRequestInProgress, true},
		{idem.ErrFingerprintMismatch, FailedPrecondition, idem.CodeKeyReused, false},
		{idem.ErrResponseUnavailable, FailedPrecondition, idem.CodeResponseUnavailable, false},
		{idem.ErrLeaseLost, Unavailable, idem.CodeLeaseLost, true},
		{idem.ErrRecordUnreadable, Unavailable, idem.CodeRecordUnreadable, true},
		{idem.ErrStoreUnavailable, Unavailable, idem.CodeStoreUnavailable, true},
	} {
		a, ok := ExecAnswer(fmt.Errorf("idem: claim: %w", tc.err))
		if !ok || a.Code != tc.code || a.Reason != tc.reason || a.Retry != tc.retry || a.Message == "" {
			t.Errorf("%v: %+v %v", tc.err, a, ok)
		}
	}
	if _, ok := ExecAnswer(errors.New("the handler's own")); ok {
		t.Error("an operation's error was taken for the executor's")
	}
	if a := KeyAnswer(idem.ErrKeyMissing, "the Idempotency-Key header"); a.Reason != idem.CodeKeyMissing || a.Code != InvalidArgument {
		t.Errorf("missing key: %+v", a)
	}
	_, err := idem.ParseKey([]string{"a", "b"})
	if a := KeyAnswer(err, "x"); a.Reason != idem.CodeKeyInvalid || a.Code != InvalidArgument || a.Message != err.Error() {
		t.Errorf("invalid key: %+v", a)
	}
}

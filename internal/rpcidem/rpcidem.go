// Package rpcidem is what idem's RPC adapters (idemgrpc, idemconnect) share,
// so that a call answers alike through either and a record written by one is
// replayed by the other: the status codes idem answers with and why, the
// default outcome policy, the fingerprint of a call and the fields of a
// stored call. It uses only the standard library and the core: each adapter
// builds its own status and detail types from an Answer.
//
// Nothing here is part of idem's API. It is imported by other modules of the
// repository, which may be built against a newer core than they were
// released with, so its exported names only ever grow: never change or
// remove one.
package rpcidem

import (
	"errors"

	"github.com/idemhq/idem"
)

// Code is a status code as google.rpc.Code numbers them; gRPC and Connect
// use the same numbers.
type Code uint32

// The codes of google.rpc.Code.
const (
	OK                 Code = 0
	Canceled           Code = 1
	Unknown            Code = 2
	InvalidArgument    Code = 3
	DeadlineExceeded   Code = 4
	NotFound           Code = 5
	AlreadyExists      Code = 6
	PermissionDenied   Code = 7
	ResourceExhausted  Code = 8
	FailedPrecondition Code = 9
	Aborted            Code = 10
	OutOfRange         Code = 11
	Unimplemented      Code = 12
	Internal           Code = 13
	Unavailable        Code = 14
	DataLoss           Code = 15
	Unauthenticated    Code = 16
)

// CodeField is the field of a stored response's Header that holds the
// call's code in decimal ("0" for a reply). Its name is kept from the first
// release of idemgrpc, whose records must stay readable.
const CodeField = "Grpc-Status"

// ErrorDomain is the domain of the ErrorInfo detail on idem's own errors.
const ErrorDomain = "idem"

// DefaultStored is the default outcome policy of both adapters. It stores OK
// and the codes that describe the request itself (InvalidArgument,
// NotFound, AlreadyExists, PermissionDenied, FailedPrecondition,
// OutOfRange, Unauthenticated): a retry would get the same answer. It
// releases every other code, which invites a retry that should run again.
func DefaultStored(c Code) bool {
	switch c {
	case OK, InvalidArgument, NotFound, AlreadyExists, PermissionDenied, FailedPrecondition, OutOfRange, Unauthenticated:
		return true
	}
	return false
}

// HTTPStatus is the HTTP status a stored call is recorded with, after the
// mapping of google.rpc.Code (which the Connect protocol also uses), so
// that idem's events and metrics read as they do for HTTP.
func HTTPStatus(c Code) int {
	switch c {
	case OK:
		return 200
	case InvalidArgument, FailedPrecondition, OutOfRange:
		return 400
	case Unauthenticated:
		return 401
	case PermissionDenied:
		return 403
	case NotFound:
		return 404
	case AlreadyExists, Aborted:
		return 409
	case ResourceExhausted:
		return 429
	case Canceled:
		return 499
	case Unimplemented:
		return 501
	case Unavailable:
		return 503
	case DeadlineExceeded:
		return 504
	}
	return 500
}

// Fingerprint is the fingerprint of a call to procedure ("/pkg.Service/Method")
// whose request message encodes, in deterministic protobuf encoding, to body.
// It does not depend on the protocol or codec the call came in with, so a
// retry over gRPC matches a first attempt over the Connect protocol with
// JSON.
func Fingerprint(procedure string, body []byte) (string, error) {
	return idem.Fingerprint(idem.FingerprintInput{Method: "grpc", Operation: procedure,
		Target: procedure, ContentType: "application/grpc+proto", Body: body, Payload: true})
}

// Answer is one of idem's own answers to a call: the handler did not run (or
// its result was discarded).
type Answer struct {
	Code Code
	// Reason is the idem problem code, sent as the ErrorInfo reason.
	Reason string
	// Message is the status message.
	Message string
	// Retry asks for a RetryInfo detail with the configured delay: the
	// client should retry with the same key.
	Retry bool
}

// KeyAnswer answers an error of idem.ParseKey; field names where the key
// travels (`the idempotency-key metadata`, `the Idempotency-Key header`).
func KeyAnswer(err error, field string) Answer {
	if errors.Is(err, idem.ErrKeyMissing) {
		return Answer{Code: InvalidArgument, Reason: idem.CodeKeyMissing,
			Message: field + " is required: send a unique value and reuse it on every retry of the call"}
	}
	return Answer{Code: InvalidArgument, Reason: idem.CodeKeyInvalid, Message: err.Error()}
}

// ScopeAnswer answers a plain error of a TenantFunc.
func ScopeAnswer(err error) Answer {
	return Answer{Code: InvalidArgument, Reason: idem.CodeScopeInvalid, Message: err.Error()}
}

// ExecAnswer answers an error of idem.Executor.Do, and reports false for an
// error that is not the executor's own (the operation's, returned as it is).
func ExecAnswer(err error) (Answer, bool) {
	switch {
	case errors.Is(err, idem.ErrInFlight):
		return Answer{Code: Aborted, Reason: idem.CodeRequestInProgress, Retry: true,
			Message: "a call with this idempotency key is in progress; retry after the indicated delay to receive its reply"}, true
	case errors.Is(err, idem.ErrFingerprintMismatch):
		return Answer{Code: FailedPrecondition, Reason: idem.CodeKeyReused,
			Message: "this idempotency key was used for a call to this method with another request message; use a new key for a new call"}, true
	case errors.Is(err, idem.ErrResponseUnavailable):
		return Answer{Code: FailedPrecondition, Reason: idem.CodeResponseUnavailable,
			Message: "the call with this key completed, but its reply was too large to store; it will not run again with this key"}, true
	case errors.Is(err, idem.ErrLeaseLost):
		return Answer{Code: Unavailable, Reason: idem.CodeLeaseLost, Retry: true,
			Message: "another attempt took over this key while the call ran; its result was discarded; retry with the same key"}, true
	case errors.Is(err, idem.ErrRecordUnreadable):
		return Answer{Code: Unavailable, Reason: idem.CodeRecordUnreadable, Retry: true,
			Message: "the call with this key already ran, in whole or in part, but its stored record cannot be decrypted here; it will not run again with this key; retry later"}, true
	case errors.Is(err, idem.ErrStoreUnavailable):
		return Answer{Code: Unavailable, Reason: idem.CodeStoreUnavailable, Retry: true,
			Message: "the call did not run because its idempotency key could not be recorded; retry with the same key"}, true
	}
	return Answer{}, false
}

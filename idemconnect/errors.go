package idemconnect

import (
	"errors"
	"time"

	"connectrpc.com/connect"
	"github.com/idemhq/idem/internal/rpcidem"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// answer builds one of idem's own errors: an ErrorInfo detail with the
// problem code, and, when the client should retry, a RetryInfo detail and a
// Retry-After header (for HTTP clients and proxies in front of the Connect
// protocol, where Aborted is 409 and Unavailable 503). A known expiry goes
// in Idempotency-Key-Expires-At.
func (h *handler) answer(a rpcidem.Answer, expires time.Time) error {
	ce := connect.NewError(connect.Code(a.Code), errors.New(a.Message))
	details := []proto.Message{&errdetails.ErrorInfo{Domain: ErrorDomain, Reason: a.Reason}}
	if a.Retry {
		details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(h.o.RetryAfter)})
		ce.Meta().Set("Retry-After", h.retryAfter)
	}
	for _, m := range details {
		// NewErrorDetail fails only for a message anypb cannot name, which
		// these registered types never are.
		if d, err := connect.NewErrorDetail(m); err == nil {
			ce.AddDetail(d)
		}
	}
	if !expires.IsZero() {
		ce.Meta().Set(HeaderExpiresAt, expires.UTC().Format(time.RFC3339))
	}
	return ce
}

// Reason returns the idem problem code of an error idemconnect's handler
// interceptor produced (such as idem.CodeRequestInProgress), read from its
// ErrorInfo detail, or "".
func Reason(err error) string {
	for _, v := range detailValues(err) {
		if info, ok := v.(*errdetails.ErrorInfo); ok && info.GetDomain() == ErrorDomain {
			return info.GetReason()
		}
	}
	return ""
}

// RetryDelay returns the delay a RetryInfo detail of err asks for, and
// whether there is one.
func RetryDelay(err error) (time.Duration, bool) {
	for _, v := range detailValues(err) {
		if ri, ok := v.(*errdetails.RetryInfo); ok && ri.GetRetryDelay() != nil {
			return ri.GetRetryDelay().AsDuration(), true
		}
	}
	return 0, false
}

// detailValues decodes the details of a *connect.Error in err's chain;
// details of types not in the protobuf registry are skipped.
func detailValues(err error) []proto.Message {
	ce := new(connect.Error)
	if !errors.As(err, &ce) {
		return nil
	}
	var out []proto.Message
	for _, d := range ce.Details() {
		if v, err := d.Value(); err == nil {
			out = append(out, v)
		}
	}
	return out
}

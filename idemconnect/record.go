package idemconnect

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"connectrpc.com/connect"
	"github.com/idemhq/idem"
	"github.com/idemhq/idem/internal/rpcidem"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/dynamicpb"
	"google.golang.org/protobuf/types/known/anypb"
)

// A stored call is an idem.Response in idemgrpc's format, which records of
// either adapter share: status 200 and the reply's protobuf bytes, or the
// HTTP status of the error's code and its google.rpc.Status bytes, with the
// code in rpcidem.CodeField. idemconnect adds, in further Header fields that
// idemgrpc ignores, the reply's message type and the response header and
// trailer fields the handler set (an error's metadata counts as header).
const (
	replyTypeField = "Idem-Reply-Type"
	headerPrefix   = "Idem-Header-"
	trailerPrefix  = "Idem-Trailer-"
)

// before holds how many values each response header and trailer field of
// the call info had before the handler ran: values set by interceptors
// outside idem's (a request id, say) belong to each attempt, not to the
// stored reply, and are left out of it.
type before struct{ header, trailer map[string]int }

// snapshot counts the call info's response fields.
func snapshot(ctx context.Context) before {
	info, ok := connect.CallInfoForHandlerContext(ctx)
	if !ok {
		return before{}
	}
	count := func(h http.Header) map[string]int {
		if len(h) == 0 {
			return nil
		}
		m := make(map[string]int, len(h))
		for k, vs := range h {
			m[k] = len(vs)
		}
		return m
	}
	return before{header: count(info.ResponseHeader()), trailer: count(info.ResponseTrailer())}
}

// encodeReply is the stored response of a successful call.
func encodeReply(ctx context.Context, r connect.AnyResponse, pre before) (*idem.Response, error) {
	m, ok := r.Any().(proto.Message)
	if !ok {
		return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("idemconnect: reply of type %T is not a protobuf message", r.Any()))
	}
	body, err := proto.Marshal(m)
	if err != nil {
		return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("idemconnect: encode the reply: %w", err))
	}
	stored := http.Header{rpcidem.CodeField: {"0"}, replyTypeField: {string(m.ProtoReflect().Descriptor().FullName())}}
	header, trailer := r.Header(), r.Trailer()
	if info, ok := connect.CallInfoForHandlerContext(ctx); ok {
		keep(stored, headerPrefix, info.ResponseHeader(), pre.header)
		keep(stored, trailerPrefix, info.ResponseTrailer(), pre.trailer)
	}
	keep(stored, headerPrefix, header, nil)
	keep(stored, trailerPrefix, trailer, nil)
	return &idem.Response{StatusCode: 200, Header: stored, Body: body}, nil
}

// encodeError is the stored response of a call that failed with a code the
// outcome policy stores.
func encodeError(ctx context.Context, herr error, pre before) (*idem.Response, error) {
	st := &spb.Status{Code: int32(connect.CodeOf(herr)), Message: herr.Error()}
	stored := http.Header{rpcidem.CodeField: {strconv.Itoa(int(st.Code))}}
	if info, ok := connect.CallInfoForHandlerContext(ctx); ok {
		keep(stored, headerPrefix, info.ResponseHeader(), pre.header)
		keep(stored, headerPrefix, info.ResponseTrailer(), pre.trailer)
	}
	if ce := new(connect.Error); errors.As(herr, &ce) {
		st.Message = ce.Message()
		for _, d := range ce.Details() {
			st.Details = append(st.Details, &anypb.Any{TypeUrl: "type.googleapis.com/" + d.Type(), Value: d.Bytes()})
		}
		keep(stored, headerPrefix, ce.Meta(), nil)
	}
	body, err := proto.Marshal(st)
	if err != nil {
		return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("idemconnect: encode the error: %w", err))
	}
	return &idem.Response{StatusCode: rpcidem.HTTPStatus(rpcidem.Code(st.Code)), Header: stored, Body: body}, nil
}

// keep copies the fields of h a replay must repeat into stored, under
// prefix: not the protocols' own (Connect-*, Grpc-*, the content fields),
// not idem's, and not Set-Cookie (as the HTTP middleware's default
// ReplayDenyHeaders), which would hand one client's session to another;
// nor the first skip[k] values of a field k.
func keep(stored http.Header, prefix string, h http.Header, skip map[string]int) {
	for k, vs := range h {
		vs = vs[min(skip[k], len(vs)):]
		if len(vs) == 0 || !replayable(k) {
			continue
		}
		stored[prefix+k] = append(stored[prefix+k], vs...)
	}
}

func replayable(k string) bool {
	c := http.CanonicalHeaderKey(k)
	if strings.HasPrefix(c, "Connect-") || strings.HasPrefix(c, "Grpc-") {
		return false
	}
	switch c {
	case "Content-Type", "Content-Length", "Content-Encoding", "Date", "Trailer", "Set-Cookie", "Set-Cookie2",
		HeaderReplayed, HeaderExpiresAt, "Retry-After":
		return false
	}
	return true
}

// restore copies the stored fields under prefix into h.
func restore(h http.Header, prefix string, stored http.Header) {
	for k, vs := range stored {
		if name, ok := strings.CutPrefix(k, prefix); ok && name != "" {
			h[name] = append(h[name], vs...)
		}
	}
}

// decode turns a stored response back into a reply or an error.
func decode(r *idem.Response, spec connect.Spec) (connect.AnyResponse, error) {
	c, err := strconv.Atoi(r.Header.Get(rpcidem.CodeField))
	if err != nil || c < 0 {
		return nil, connect.NewError(connect.CodeInternal, errors.New("idemconnect: stored response without a code"))
	}
	if c != 0 {
		var st spb.Status
		if err := proto.Unmarshal(r.Body, &st); err != nil {
			return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("idemconnect: stored error: %w", err))
		}
		var msg error
		if st.GetMessage() != "" {
			msg = errors.New(st.GetMessage())
		}
		ce := connect.NewError(connect.Code(c), msg)
		for _, a := range st.GetDetails() {
			if d, err := connect.NewErrorDetail(a); err == nil {
				ce.AddDetail(d)
			}
		}
		restore(ce.Meta(), headerPrefix, r.Header)
		return nil, ce
	}
	mt := replyType(spec, r.Header.Get(replyTypeField))
	if mt == nil {
		return nil, connect.NewError(connect.CodeInternal, fmt.Errorf(
			"idemconnect: the stored reply of %s cannot be decoded: its message type %q is unknown here (register the handler with connect.WithSchema, as generated code does)",
			spec.Procedure, r.Header.Get(replyTypeField)))
	}
	m := mt.New().Interface()
	if err := proto.Unmarshal(r.Body, m); err != nil {
		return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("idemconnect: stored reply: %w", err))
	}
	out := connect.NewResponse(&reply{m})
	restore(out.Header(), headerPrefix, r.Header)
	restore(out.Trailer(), trailerPrefix, r.Header)
	return out, nil
}

// reply carries a replayed message of a type known only at run time. The
// handler sends a response's message with the codec the call negotiated,
// which reaches the message through proto.Message's ProtoReflect, here the
// embedded message's: it encodes exactly as that message does, in binary
// and in JSON.
type reply struct{ proto.Message }

// replyType finds the message type of a procedure's reply: from the
// handler's schema (connect.WithSchema, which generated code passes), as the
// generated Go type when it is registered and dynamically otherwise; else
// from the global registry by procedure name, else by the type name the
// record holds.
func replyType(spec connect.Spec, stored string) protoreflect.MessageType {
	if md, ok := spec.Schema.(protoreflect.MethodDescriptor); ok {
		if mt, err := protoregistry.GlobalTypes.FindMessageByName(md.Output().FullName()); err == nil {
			return mt
		}
		return dynamicpb.NewMessageType(md.Output())
	}
	name := strings.ReplaceAll(strings.TrimPrefix(spec.Procedure, "/"), "/", ".")
	if d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(name)); err == nil {
		if md, ok := d.(protoreflect.MethodDescriptor); ok {
			if mt, err := protoregistry.GlobalTypes.FindMessageByName(md.Output().FullName()); err == nil {
				return mt
			}
		}
	}
	if stored != "" {
		if mt, err := protoregistry.GlobalTypes.FindMessageByName(protoreflect.FullName(stored)); err == nil {
			return mt
		}
	}
	return nil
}

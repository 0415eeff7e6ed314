package idemconnect

import (
	"net/http"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"github.com/idemhq/idem"
	"github.com/idemhq/idem/internal/rpcidem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// A record as idemgrpc writes it (the code field and the reply's bytes, no
// reply type) replays through the handler's schema; without a schema, a
// registry entry or a stored type, decode says why it cannot.
func TestDecodeIdemgrpcRecord(t *testing.T) {
	body, _ := proto.Marshal(wrapperspb.String("from grpc-go"))
	rec := &idem.Response{StatusCode: 200, Header: http.Header{rpcidem.CodeField: {"0"}}, Body: body}
	schema := wrapperspb.File_google_protobuf_wrappers_proto.Messages().ByName("StringValue")
	spec := connect.Spec{Procedure: "/svc.V1/Get", Schema: fakeMethod{out: schema}}
	r, err := decode(rec, spec)
	if err != nil {
		t.Fatal(err)
	}
	if m, ok := r.Any().(proto.Message); !ok || !proto.Equal(m.(*reply).Message, wrapperspb.String("from grpc-go")) {
		t.Errorf("decoded %v", r.Any())
	}
	_, err = decode(rec, connect.Spec{Procedure: "/svc.V1/Get"})
	if connect.CodeOf(err) != connect.CodeInternal || !strings.Contains(err.Error(), "WithSchema") {
		t.Errorf("without a way to find the type: %v", err)
	}
}

// fakeMethod is a method descriptor whose output is out; only Output is
// called.
type fakeMethod struct {
	protoreflect.MethodDescriptor
	out protoreflect.MessageDescriptor
}

func (f fakeMethod) Output() protoreflect.MessageDescriptor { return f.out }

// FuzzDecode: no stored record, however damaged, makes decode panic; it
// answers a reply or an error.
func FuzzDecode(f *testing.F) {
	ok, _ := proto.Marshal(wrapperspb.String("x"))
	f.Add("0", "google.protobuf.StringValue", ok)
	f.Add("5", "", []byte("\x08\x05\x12\x03abc"))
	f.Add("x", "", []byte{0xff})
	f.Fuzz(func(t *testing.T, code, typ string, body []byte) {
		rec := &idem.Response{StatusCode: 200, Header: http.Header{rpcidem.CodeField: {code}, replyTypeField: {typ},
			headerPrefix + "X-A": {"1"}}, Body: body}
		r, err := decode(rec, connect.Spec{Procedure: "/a.B/C"})
		if (r == nil) == (err == nil) {
			t.Fatalf("decode returned %v and %v", r, err)
		}
	})
}

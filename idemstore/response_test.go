package idemstore_test

import (
	"testing"

	"github.com/idemhq/idem/idemstore"
)

func TestResponseEncoding(t *testing.T) {
	in := &idemstore.Response{StatusCode: 201, Header: map[string][]string{"B": {"2", "3"}, "A": {"1"}, "E": {}}, Body: []byte("body\x00\xff")}
	enc, err := in.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	if len(enc) != in.EncodedSize() {
		t.Errorf("EncodedSize = %d, encoding has %d bytes", in.EncodedSize(), len(enc))
	}
	var out idemstore.Response
	if err := out.UnmarshalBinary(enc); err != nil {
		t.Fatal(err)
	}
	if out.StatusCode != 201 || string(out.Body) != "body\x00\xff" || len(out.Header) != 3 ||
		out.Header["B"][1] != "3" || out.Unreplayable {
		t.Fatalf("round trip: %+v", out)
	}
	for i := range enc {
		var r idemstore.Response
		if err := r.UnmarshalBinary(enc[:i]); err == nil {
			t.Fatalf("truncated encoding of %d bytes decoded", i)
		}
	}
	if _, err := (&idemstore.Response{StatusCode: 42}).MarshalBinary(); err == nil {
		t.Error("status 42 encoded")
	}
}

// FuzzResponseDecoding checks that arbitrary stored bytes never crash the
// decoder and that whatever decodes re-encodes to the same bytes.
func FuzzResponseDecoding(f *testing.F) {
	enc, _ := (&idemstore.Response{StatusCode: 200, Header: map[string][]string{"A": {"b"}}, Body: []byte("x")}).MarshalBinary()
	f.Add(enc)
	f.Fuzz(func(t *testing.T, data []byte) {
		var r idemstore.Response
		if err := r.UnmarshalBinary(data); err != nil {
			return
		}
		if r.EncodedSize() > len(data)+1 {
			t.Fatalf("decoded %d bytes into a response of encoded size %d", len(data), r.EncodedSize())
		}
	})
}

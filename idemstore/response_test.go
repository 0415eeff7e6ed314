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

// TestResponseEncodingBytes pins the encoding: names sorted, every field
// length-prefixed, one walk of the header or not.
func TestResponseEncodingBytes(t *testing.T) {
	in := &idemstore.Response{StatusCode: 201, Header: map[string][]string{"B": {"2", "3"}, "A": {"1"}}, Body: []byte("x")}
	want := "\x01\x00\xc9\x01\x02\x01A\x01\x011\x01B\x02\x012\x013\x01x"
	enc, err := in.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	app, err := in.AppendBinary([]byte("pre"))
	if err != nil {
		t.Fatal(err)
	}
	if string(enc) != want || string(app) != "pre"+want || cap(enc) != len(want) {
		t.Fatalf("MarshalBinary = %q (cap %d), AppendBinary = %q, want %q", enc, cap(enc), app, want)
	}
}

// TestDecodeResponse checks DecodeResponse against UnmarshalBinary with
// few and many header values, and that the shared value slices are capped.
func TestDecodeResponse(t *testing.T) {
	for _, h := range []map[string][]string{
		nil,
		{"A": {"1"}, "B": {"2", "3"}},
		{"A": {"1", "2", "3"}, "B": {"4", "5"}, "C": {"6"}},
	} {
		enc, err := (&idemstore.Response{StatusCode: 200, Header: h, Body: []byte("b")}).MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		got, err := idemstore.DecodeResponse(enc)
		if err != nil {
			t.Fatal(err)
		}
		var want idemstore.Response
		if err := want.UnmarshalBinary(enc); err != nil {
			t.Fatal(err)
		}
		re, _ := got.MarshalBinary()
		if string(re) != string(enc) || len(got.Header) != len(want.Header) || string(got.Body) != "b" {
			t.Fatalf("DecodeResponse = %+v, want %+v", got, want)
		}
		if vs := got.Header["A"]; vs != nil {
			_ = append(vs, "x")
			if b := got.Header["B"]; b[0] == "x" {
				t.Fatal("appending to one field's values overwrote another's")
			}
		}
	}
	if _, err := idemstore.DecodeResponse([]byte{1}); err == nil {
		t.Fatal("truncated encoding decoded")
	}
}

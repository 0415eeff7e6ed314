package outbox_test

import (
	"errors"
	"maps"
	"strings"
	"testing"

	"github.com/idemhq/idem/outbox"
)

func TestValidate(t *testing.T) {
	t.Parallel()
	ok := outbox.Message{ID: "payment.created:pay_1", Topic: "idem.payments.created", Key: "t_1", Payload: []byte("{}"),
		Headers: map[string]string{"Content-Type": "application/json"}}
	if err := outbox.Validate(ok); err != nil {
		t.Fatal(err)
	}
	for name, m := range map[string]outbox.Message{
		"no id":          {Topic: "t"},
		"long id":        {ID: strings.Repeat("x", outbox.MaxIDLength+1), Topic: "t"},
		"id with space":  {ID: "a b", Topic: "t"},
		"no topic":       {ID: "x"},
		"wildcard topic": {ID: "x", Topic: "a.*"},
		"long key":       {ID: "x", Topic: "t", Key: strings.Repeat("k", outbox.MaxKeyLength+1)},
		"big payload":    {ID: "x", Topic: "t", Payload: make([]byte, outbox.DefaultMaxPayload+1)},
		"header name":    {ID: "x", Topic: "t", Headers: map[string]string{"a b": "v"}},
		"header value":   {ID: "x", Topic: "t", Headers: map[string]string{"a": "v\nx"}},
	} {
		if err := outbox.Validate(m); !errors.Is(err, outbox.ErrInvalidMessage) {
			t.Errorf("%s: %v, want ErrInvalidMessage", name, err)
		}
	}
	m := outbox.Message{Topic: "t"}
	if err := outbox.Prepare(&m); err != nil || !strings.HasPrefix(m.ID, "msg_") || m.ID == outbox.NewID() {
		t.Fatalf("Prepare gave id %q, %v", m.ID, err)
	}
}

// Headers survive the stores' column form, and the decoder refuses what is
// not a JSON object of strings.
func FuzzHeaders(f *testing.F) {
	f.Add("Content-Type", "application/json", `{"a":"b"}`)
	f.Add("", "", ``)
	f.Add("x", "\u00e9\x00", `[1]`)
	f.Fuzz(func(t *testing.T, k, v, stored string) {
		h := map[string]string{k: v}
		enc, err := outbox.EncodeHeaders(h)
		if err != nil {
			t.Fatal(err)
		}
		dec, err := outbox.DecodeHeaders(enc)
		if err != nil {
			t.Fatalf("decode %q: %v", enc, err)
		}
		// JSON replaces invalid UTF-8; compare the valid case only.
		if strings.ToValidUTF8(k, "\ufffd") == k && strings.ToValidUTF8(v, "\ufffd") == v && !maps.Equal(dec, h) {
			t.Fatalf("round trip %v -> %q -> %v", h, enc, dec)
		}
		if d, err := outbox.DecodeHeaders(stored); err == nil && stored != "" && d == nil && stored != "null" {
			t.Fatalf("decoded %q to nil without an error", stored)
		}
	})
}

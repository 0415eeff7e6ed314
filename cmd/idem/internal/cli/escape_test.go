package cli

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestTermField(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ in, want string }{
		{"order-42", "order-42"},
		{"4:acme|POST /payments", `"4:acme|POST /payments"`},
		{"", `""`},
		{`"quoted"`, `"\"quoted\""`},
		{"a\x1b]52;c;x\x07", `"a\x1b]52;c;x\a"`},
		{"c1\u009b", `"c1\u009b"`},
		{"bidi\u202e", `"bidi\u202e"`},
		{"bad\xff", `"bad\xff"`},
		{"idem:{ab}", "idem:{ab}"},
		{`back\slash`, `back\slash`},
		{"naïve", "naïve"},
	} {
		if got := termField(c.in); got != c.want {
			t.Errorf("termField(%q) = %s, want %s", c.in, got, c.want)
		}
		if back, err := argField(termField(c.in)); err != nil || back != c.in {
			t.Errorf("argField(termField(%q)) = %q, %v", c.in, back, err)
		}
	}
	if _, err := argField(`"open`); err == nil {
		t.Error(`argField("open) accepted a quote that does not close`)
	}
}

func TestTermText(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		in        string
		multiline bool
		want      string
		n         int
	}{
		{"plain\ntext\twith tab", true, "plain\ntext\twith tab", 0},
		{"plain\ntext", false, `plain\ntext`, 1},
		{"osc\x1b]52;c;SGk=\x07", true, `osc\x1b]52;c;SGk=\a`, 2},
		{"cr\r\n", true, "cr\\r\n", 1},
		{"c1\u0085\u009b del\x7f", true, `c1\u0085\u009b del\x7f`, 3},
		{"\xff\xfe ok", true, `\xff\xfe ok`, 2},
		{"zwj\u200d lrm\u200e", true, `zwj\u200d lrm\u200e`, 2},
		{"emoji 😀 ünïcode", true, "emoji 😀 ünïcode", 0},
	} {
		got, n := termText(c.in, c.multiline)
		if got != c.want || n != c.n {
			t.Errorf("termText(%q, %v) = %q, %d; want %q, %d", c.in, c.multiline, got, n, c.want, c.n)
		}
	}
}

func TestEscapeJSON(t *testing.T) {
	t.Parallel()
	in := "del\x7f c1\u0085 bidi\u202e tag\U000E0001 esc\x1b ok é"
	b, err := json.Marshal(map[string]string{"v": in})
	if err != nil {
		t.Fatal(err)
	}
	out := escapeJSON(b)
	terminalSafe(t, "escapeJSON", string(out))
	if want := `\u007f c1\u0085 bidi\u202e tag\udb40\udc01 esc\u001b ok é`; !strings.Contains(string(out), want) {
		t.Errorf("escapeJSON = %s, want it to contain %s", out, want)
	}
	var back map[string]string
	if err := json.Unmarshal(out, &back); err != nil || back["v"] != in {
		t.Errorf("escapeJSON's output decodes to %q, %v; want %q", back["v"], err, in)
	}
}

// FuzzEscape: whatever a record holds, the forms the operator commands
// print are safe for a terminal, and the quoted field and the JSON string
// give the exact value back.
func FuzzEscape(f *testing.F) {
	f.Add("order-42")
	f.Add("\x1b]52;c;SGVsbG8=\x07")
	f.Add("\"quoted\" \u009b\u202e\xff")
	f.Fuzz(func(t *testing.T, s string) {
		field := termField(s)
		terminalSafe(t, "termField", field)
		if strings.ContainsAny(field, " \t\n") && !strings.HasPrefix(field, `"`) {
			t.Fatalf("termField(%q) = %q: a space outside quotes splits a column", s, field)
		}
		if back, err := argField(field); err != nil || back != s {
			t.Fatalf("argField(termField(%q)) = %q, %v", s, back, err)
		}
		for _, multiline := range []bool{true, false} {
			text, _ := termText(s, multiline)
			terminalSafe(t, "termText", text)
			if !multiline && strings.ContainsAny(text, "\n\t") {
				t.Fatalf("termText(%q, false) = %q spans lines", s, text)
			}
		}
		v, quoted := jsonString(s)
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		out := escapeJSON(b)
		terminalSafe(t, "escapeJSON", string(out))
		var got string
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatalf("escapeJSON(%s) = %s: %v", b, out, err)
		}
		if back, err := argField(got); err != nil || back != s || quoted != (got != s) {
			t.Fatalf("the JSON string of %q reads back as %q (quoted %v), %v", s, back, quoted, err)
		}
	})
}

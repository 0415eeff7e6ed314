package idemclient_test

import (
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemhq/idem/idemclient"
)

// FuzzRetryAfter feeds arbitrary Retry-After values to the client's parser:
// it never panics, never returns a negative wait, and reads delay-seconds
// exactly (saturating instead of overflowing).
func FuzzRetryAfter(f *testing.F) {
	for _, s := range []string{"", "0", "3", " 120 ", "18446744073709551616", "9223372036", "-1", "1.5",
		"Wed, 21 Oct 2015 07:28:00 GMT", "Sun, 06 Nov 2094 08:49:37 GMT", "Sunday, 06-Nov-94 08:49:37 GMT", "soon"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		d, ok := idemclient.RetryAfter(v)
		if d < 0 {
			t.Fatalf("RetryAfter(%q) = %v, a negative wait", v, d)
		}
		if !ok && d != 0 {
			t.Fatalf("RetryAfter(%q) = %v but not ok", v, d)
		}
		trimmed := strings.TrimSpace(v)
		if trimmed == "" || strings.Trim(trimmed, "0123456789") != "" {
			return
		}
		// Only digits: delay-seconds.
		if !ok {
			t.Fatalf("RetryAfter(%q) refused delay-seconds", v)
		}
		s, err := strconv.ParseUint(trimmed, 10, 64)
		switch {
		case err != nil || s > uint64(math.MaxInt64/int64(time.Second)):
			if d != math.MaxInt64 {
				t.Fatalf("RetryAfter(%q) = %v, want the saturated maximum", v, d)
			}
		case d != time.Duration(s)*time.Second:
			t.Fatalf("RetryAfter(%q) = %v, want %ds", v, d, s)
		}
	})
}

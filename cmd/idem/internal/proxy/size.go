package proxy

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// sizeUnits are the suffixes ParseSize accepts, longest first so that
// "KiB" is tried before "B".
var sizeUnits = []struct {
	suffix string
	factor int64
}{
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30},
	{"KB", 1000}, {"MB", 1000 * 1000}, {"GB", 1000 * 1000 * 1000},
	{"B", 1},
}

// ParseSize parses a byte count: a plain integer ("1048576") or an integer
// with a unit, binary (KiB, MiB, GiB) or decimal (KB, MB, GB, B). The
// result is positive.
func ParseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	factor := int64(1)
	for _, u := range sizeUnits {
		if strings.HasSuffix(t, u.suffix) {
			t, factor = strings.TrimSpace(strings.TrimSuffix(t, u.suffix)), u.factor
			break
		}
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("invalid size %q: use a whole number of bytes, optionally with a unit (KiB, MiB, GiB, KB, MB, GB)", s)
	}
	if n <= 0 {
		return 0, fmt.Errorf("invalid size %q: must be positive", s)
	}
	if n > math.MaxInt64/factor {
		return 0, fmt.Errorf("invalid size %q: too large", s)
	}
	return n * factor, nil
}

// FormatSize writes n in the largest binary unit that divides it, so that
// ParseSize(FormatSize(n)) == n.
func FormatSize(n int64) string {
	for _, u := range []struct {
		suffix string
		factor int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n >= u.factor && n%u.factor == 0 {
			return strconv.FormatInt(n/u.factor, 10) + u.suffix
		}
	}
	return strconv.FormatInt(n, 10)
}

// SizeFlag is a flag.Value holding a byte count written as ParseSize
// accepts.
type SizeFlag int64

// String implements flag.Value.
func (s *SizeFlag) String() string { return FormatSize(int64(*s)) }

// Set implements flag.Value.
func (s *SizeFlag) Set(v string) error {
	n, err := ParseSize(v)
	if err != nil {
		return err
	}
	*s = SizeFlag(n)
	return nil
}

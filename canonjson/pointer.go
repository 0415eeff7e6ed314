package canonjson

import (
	"fmt"
	"strings"
)

// ParsePointer splits an RFC 6901 JSON Pointer ("/order/items/0/sku")
// into its reference tokens, unescaping "~1" to "/" and "~0" to "~". The
// empty pointer "" names the whole document and has no tokens. A pointer
// that does not start with "/", or holds a "~" not followed by 0 or 1, is
// an error.
func ParsePointer(p string) ([]string, error) {
	if p == "" {
		return nil, nil
	}
	if p[0] != '/' {
		return nil, fmt.Errorf("canonjson: JSON Pointer %q does not start with \"/\"", p)
	}
	tokens := strings.Split(p[1:], "/")
	for i, t := range tokens {
		for j := 0; j < len(t); j++ {
			if t[j] == '~' && (j+1 == len(t) || (t[j+1] != '0' && t[j+1] != '1')) {
				return nil, fmt.Errorf("canonjson: JSON Pointer %q has a \"~\" not followed by 0 or 1", p)
			}
		}
		tokens[i] = strings.ReplaceAll(strings.ReplaceAll(t, "~1", "/"), "~0", "~")
	}
	return tokens, nil
}

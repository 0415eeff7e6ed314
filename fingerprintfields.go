package idem

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/idemhq/idem/canonjson"
)

// fieldSelection is Config.FingerprintInclude and FingerprintExclude,
// parsed.
type fieldSelection struct {
	include [][]string
	exclude [][]string
	names   []string // the include pointers as written
}

func newFieldSelection(include, exclude []string) (*fieldSelection, error) {
	if len(include) == 0 && len(exclude) == 0 {
		return nil, nil
	}
	if len(include) > 0 && len(exclude) > 0 {
		return nil, errors.New("idem: set FingerprintInclude or FingerprintExclude, not both")
	}
	fs := &fieldSelection{}
	for _, p := range include {
		t, err := canonjson.ParsePointer(p)
		if err != nil {
			return nil, fmt.Errorf("FingerprintInclude: %w", err)
		}
		fs.include, fs.names = append(fs.include, t), append(fs.names, p)
	}
	for _, p := range exclude {
		t, err := canonjson.ParsePointer(p)
		if err != nil {
			return nil, fmt.Errorf("FingerprintExclude: %w", err)
		}
		if len(t) == 0 {
			return nil, errors.New("idem: FingerprintExclude: the empty pointer would exclude the whole body")
		}
		fs.exclude = append(fs.exclude, t)
	}
	return fs, nil
}

// apply returns the JSON document to fingerprint instead of body: with
// include pointers, an object mapping each pointer (as written) to the
// value it selects, absent pointers left out; with exclude pointers, the
// body without the members or array elements they name. Numbers keep their exact text. body must be valid JSON: callers
// check it first with the canonicaliser, which is stricter than
// encoding/json (duplicate member names, invalid UTF-8).
func (fs *fieldSelection) apply(body []byte) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var doc any
	if err := dec.Decode(&doc); err != nil {
		return nil, fmt.Errorf("%w: %v", canonjson.ErrInvalid, err)
	}
	if len(fs.include) > 0 {
		picked := make(map[string]any, len(fs.include))
		for i, t := range fs.include {
			if v, ok := lookup(doc, t); ok {
				picked[fs.names[i]] = v
			}
		}
		doc = picked
	}
	for _, t := range fs.exclude {
		doc = remove(doc, t)
	}
	return json.Marshal(doc)
}

// lookup returns the value at tokens in v.
func lookup(v any, tokens []string) (any, bool) {
	for _, t := range tokens {
		switch c := v.(type) {
		case map[string]any:
			var ok bool
			if v, ok = c[t]; !ok {
				return nil, false
			}
		case []any:
			i, ok := arrayIndex(t, len(c))
			if !ok {
				return nil, false
			}
			v = c[i]
		default:
			return nil, false
		}
	}
	return v, true
}

// remove returns v without the member or element at tokens (v unchanged if
// there is none).
func remove(v any, tokens []string) any {
	if len(tokens) == 0 {
		return v
	}
	t, rest := tokens[0], tokens[1:]
	switch c := v.(type) {
	case map[string]any:
		child, ok := c[t]
		if !ok {
			return v
		}
		if len(rest) == 0 {
			delete(c, t)
		} else {
			c[t] = remove(child, rest)
		}
	case []any:
		i, ok := arrayIndex(t, len(c))
		if !ok {
			return v
		}
		if len(rest) == 0 {
			return append(c[:i:i], c[i+1:]...)
		}
		c[i] = remove(c[i], rest)
	}
	return v
}

// arrayIndex parses an RFC 6901 array index: digits without a leading
// zero, within n.
func arrayIndex(t string, n int) (int, bool) {
	if t == "" || (len(t) > 1 && t[0] == '0') {
		return 0, false
	}
	i, err := strconv.Atoi(t)
	if err != nil || i < 0 || i >= n {
		return 0, false
	}
	return i, true
}

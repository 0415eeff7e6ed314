package proxy

import (
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/memstore"
)

func TestParseFileResolvesRoutes(t *testing.T) {
	t.Parallel()
	base := DefaultSettings()
	base.Lease = 5 * time.Second
	f, err := ParseFile("r.yaml", []byte(`
version: 1
routes:
  "POST /payments":
    key: required
    ttl: 48h
    lease: 10s
    wait: 2s
    upstream_timeout: 5s
    scope_header: X-Api-Key
    max_request_body: 64KiB
    max_response_body: 2MiB
    store_statuses: [503]
    release_statuses: [4xx, "409"]
  /orders/{id}/refund:
    methods: [POST, PUT]
  "/legacy/":
  "PATCH /users/{id}":
    scope_header: ""
  "PATCH /groups/{id}":
    scope_header: None
`), base)
	if err != nil {
		t.Fatal(err)
	}
	if len(f.Routes) != 5 {
		t.Fatalf("%d routes", len(f.Routes))
	}
	pay := f.Routes[0]
	if pay.Pattern != "POST /payments" || pay.Line != 4 {
		t.Fatalf("route 0: %q line %d", pay.Pattern, pay.Line)
	}
	s := pay.Settings
	if s.Key != idem.KeyRequired || s.TTL != 48*time.Hour || s.Lease != 10*time.Second || s.Wait != 2*time.Second ||
		s.UpstreamTimeout != 5*time.Second || s.ScopeHeader != "X-Api-Key" || s.MaxRequestBody != 64<<10 || s.MaxResponseBody != 2<<20 {
		t.Fatalf("payments settings: %+v", s)
	}
	for status, want := range map[int]idem.Outcome{
		503: idem.OutcomeStore, 409: idem.OutcomeRelease, 404: idem.OutcomeRelease,
		200: idem.OutcomeStore, 500: idem.OutcomeRelease, 502: idem.OutcomeRelease,
	} {
		if got := s.Outcome.Outcome(status); got != want {
			t.Errorf("outcome of %d = %v, want %v", status, got, want)
		}
	}
	refund := f.Routes[1].Settings
	if refund.Key != idem.KeyByMethod || !slices.Equal(refund.Methods, []string{"POST", "PUT"}) || refund.Lease != 5*time.Second || refund.Outcome != nil {
		t.Fatalf("refund inherits from the flags: %+v", refund)
	}
	if legacy := f.Routes[2].Settings; legacy.Lease != base.Lease || legacy.ScopeHeader != "Authorization" {
		t.Fatalf("an empty route is the flags' settings: %+v", legacy)
	}
	if f.Routes[3].Settings.ScopeHeader != "" || f.Routes[4].Settings.ScopeHeader != "" {
		t.Fatal(`scope_header: "" and none mean no scope`)
	}
	// The checked routes are accepted by New.
	st, _ := memstore.New(nil)
	u, _ := url.Parse("http://127.0.0.1:1")
	if _, err := New(&Config{Upstream: u, Store: st, Routes: f.ProxyRoutes()}); err != nil {
		t.Fatal(err)
	}
}

func TestParseFileErrorsHaveLines(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, yaml string
		want       []string // "LINE:COL: substring" or "LINE: substring"
	}{
		{"unknown top-level field", "routes: {}\nroute:\n", []string{`2:1: unknown field "route"`}},
		{"unknown route field", "routes:\n  \"POST /a\":\n    ttl: 1h\n    tll: 2h\n", []string{`4:5: route "POST /a": unknown field "tll"`}},
		{"duplicate field", "routes:\n  \"POST /a\":\n    ttl: 1h\n    ttl: 2h\n", []string{`4:5: route "POST /a": "ttl" is given twice (first on line 3)`}},
		{"duplicate route", "routes:\n  \"POST /a\":\n  \"POST /a\":\n", []string{`3:3: "POST /a" is given twice (first on line 2)`}},
		{"bad key", "routes:\n  \"POST /a\":\n    key: always\n", []string{`3:10: route "POST /a": key: "always" is not one of`}},
		{"bad duration", "routes:\n  \"POST /a\":\n    lease: 30\n", []string{`3:12: route "POST /a": lease: "30" is not a duration`}},
		{"short lease", "routes:\n  \"POST /a\":\n    lease: 1ms\n", []string{`3:5: route "POST /a": lease 1ms is shorter than the minimum`}},
		{"ttl below inherited lease", "routes:\n  \"POST /a\":\n    ttl: 1s\n", []string{`3:5: route "POST /a": ttl 1s is shorter than lease 30s (lease comes from --lease)`}},
		{"lease above inherited ttl", "routes:\n  \"POST /a\":\n    lease: 25h\n", []string{`3:5: route "POST /a": ttl 24h0m0s is shorter than lease 25h0m0s`}},
		{"ttl beyond the maximum", "routes:\n  \"POST /a\":\n    ttl: 2562047h47m16s\n", []string{`3:5: route "POST /a": ttl 2562047h47m16s is longer than the maximum 87600h0m0s (3650 days)`}},
		{"wait beyond the maximum", "routes:\n  \"POST /a\":\n    wait: 100000h\n", []string{`3:5: route "POST /a": wait 100000h0m0s is longer than the maximum 87600h0m0s (3650 days)`}},
		{"bad size", "routes:\n  \"POST /a\":\n    max_request_body: lots\n", []string{`3:23: route "POST /a": max_request_body: invalid size "lots"`}},
		{"zero size", "routes:\n  \"POST /a\":\n    max_response_body: 0\n", []string{`3:24: route "POST /a": max_response_body: invalid size "0": must be positive`}},
		{"store 5xx", "routes:\n  \"POST /a\":\n    store_statuses: [200, 5xx]\n", []string{`3:27: route "POST /a": store_statuses: 5xx cannot be stored`}},
		{"store 504", "routes:\n  \"POST /a\":\n    store_statuses: [504]\n", []string{`3:22: route "POST /a": store_statuses: 504 cannot be stored`}},
		{"status twice", "routes:\n  \"POST /a\":\n    store_statuses: [409]\n    release_statuses: [409]\n", []string{`4:24: route "POST /a": release_statuses: 409 is listed twice`}},
		{"bad status", "routes:\n  \"POST /a\":\n    release_statuses: [600, 6xx]\n", []string{`3:24: route "POST /a": release_statuses: "600" is not a status code`, `3:29: route "POST /a": release_statuses: "6xx" is not`}},
		{"lower-case method", "routes:\n  \"/a\":\n    methods: [post]\n", []string{`3:15: route "/a": methods: method "post": methods are case-sensitive`}},
		{"methods without by-method", "routes:\n  \"/a\":\n    key: required\n    methods: [PUT]\n", []string{`4:5: route "/a": methods applies only with key: by-method`}},
		{"method the key rule ignores", "routes:\n  \"PUT /a\":\n    ttl: 1h\n", []string{`2:3: route "PUT /a": the pattern matches only PUT, which is not among the methods that need a key`}},
		{"invalid pattern", "routes:\n  \"POST payments\":\n    key: required\n", []string{`2:3: route "POST payments": parsing "POST payments"`}},
		{"conflicting patterns", "routes:\n  \"/a/{x}\":\n  \"/a/{y}\":\n", []string{`3:3: route "/a/{y}": pattern "/a/{y}" conflicts with pattern "/a/{x}": /a/{y} matches the same requests as /a/{x} (line 2)`}},
		{"scalar route", "routes:\n  \"POST /a\": 5\n", []string{`2:14: route "POST /a": its settings must be a mapping`}},
		{"routes not a mapping", "routes: [a, b]\n", []string{`1:9: routes must be a mapping`}},
		{"not a mapping", "- a\n- b\n", []string{`1:1: the file must be a mapping`}},
		{"bad version", "version: 2\n", []string{`1:10: version: only version 1 exists`}},
		{"null scope header", "routes:\n  \"POST /a\":\n    scope_header:\n", []string{`3:18: route "POST /a": scope_header: give a header name`}},
		{"bad scope header", "routes:\n  \"POST /a\":\n    scope_header: \"X Bad\"\n", []string{`3:5: route "POST /a": scope_header "X Bad" is not a valid header name`}},
		{"syntax", "routes:\n  \"POST /a\":\n    key: [required\n", []string{`2: invalid YAML: did not find expected ',' or ']'`}},
		{"two documents", "routes: {}\n---\nroutes: {}\n", []string{`2:1: a second YAML document`}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			_, err := ParseFile("f.yaml", []byte(c.yaml), DefaultSettings())
			var ce *ConfigErrors
			if !errors.As(err, &ce) {
				t.Fatalf("err = %v, want *ConfigErrors", err)
			}
			text := err.Error()
			for _, w := range c.want {
				if !strings.Contains(text, "f.yaml:"+w) {
					t.Errorf("missing %q in:\n%s", w, text)
				}
			}
			if len(ce.Errors) != len(c.want) {
				t.Errorf("%d errors, want %d:\n%s", len(ce.Errors), len(c.want), text)
			}
		})
	}
}

func TestParseFileEmptyAndComments(t *testing.T) {
	t.Parallel()
	for _, content := range []string{"", "# nothing yet\n", "routes:\n", "version: 1\nroutes: {}\n"} {
		f, err := ParseFile("f.yaml", []byte(content), DefaultSettings())
		if err != nil || len(f.Routes) != 0 {
			t.Errorf("%q: %v %v", content, f, err)
		}
	}
}

func TestLoadFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if _, err := LoadFile(filepath.Join(dir, "missing.yaml"), DefaultSettings()); err == nil {
		t.Fatal("a missing file loaded")
	}
	big := filepath.Join(dir, "big.yaml")
	if err := os.WriteFile(big, []byte("# "+strings.Repeat("x", MaxConfigSize)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var ce *ConfigErrors
	if _, err := LoadFile(big, DefaultSettings()); !errors.As(err, &ce) {
		t.Fatalf("an oversized file: %v", err)
	}
}

func TestParseSize(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]int64{
		"1": 1, "1024": 1024, "64KiB": 64 << 10, "1MiB": 1 << 20, "2GiB": 2 << 30,
		"10KB": 10000, "1MB": 1000000, "3GB": 3000000000, "512B": 512, " 8 KiB ": 8 << 10,
	} {
		got, err := ParseSize(in)
		if err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
		if back, err := ParseSize(FormatSize(got)); err != nil || back != got {
			t.Errorf("FormatSize(%d) = %q does not parse back", got, FormatSize(got))
		}
	}
	for _, in := range []string{"", "0", "-1", "1.5MiB", "MiB", "1TiB", "9999999999GiB", "1 parsec"} {
		if n, err := ParseSize(in); err == nil {
			t.Errorf("ParseSize(%q) = %d, want an error", in, n)
		}
	}
	var f SizeFlag
	if err := f.Set("2MiB"); err != nil || f.String() != "2MiB" {
		t.Fatalf("SizeFlag: %v %s", err, f.String())
	}
}

func TestOutcomePolicy(t *testing.T) {
	t.Parallel()
	var def *OutcomePolicy
	for status, want := range map[int]idem.Outcome{200: idem.OutcomeStore, 404: idem.OutcomeStore, 429: idem.OutcomeRelease, 500: idem.OutcomeRelease, 502: idem.OutcomeRelease} {
		if got := def.Outcome(status); got != want {
			t.Errorf("default policy, %d: %v", status, got)
		}
	}
	p, err := NewOutcomePolicy([]string{"503", "429"}, []string{"4xx", "201"})
	if err != nil {
		t.Fatal(err)
	}
	for status, want := range map[int]idem.Outcome{
		503: idem.OutcomeStore, 429: idem.OutcomeStore, 404: idem.OutcomeRelease, 201: idem.OutcomeRelease,
		200: idem.OutcomeStore, 500: idem.OutcomeRelease, 502: idem.OutcomeRelease, 504: idem.OutcomeRelease,
	} {
		if got := p.Outcome(status); got != want {
			t.Errorf("%d: %v, want %v", status, got, want)
		}
	}
	if s := p.String(); s != "store 429 503; release 4xx 201; otherwise default" {
		t.Errorf("String() = %q", s)
	}
	for _, bad := range [][2][]string{{{"502"}, nil}, {{"5xx"}, nil}, {{"200"}, {"200"}}, {nil, {"2xx", "2XX"}}, {{"abc"}, nil}} {
		if _, err := NewOutcomePolicy(bad[0], bad[1]); err == nil {
			t.Errorf("NewOutcomePolicy(%q, %q) accepted", bad[0], bad[1])
		}
	}
}

// FuzzParseFile checks that no input crashes the parser and that every
// file it accepts gives settings New accepts.
func FuzzParseFile(f *testing.F) {
	f.Add([]byte(goodConfig))
	f.Add([]byte(badConfig))
	f.Add([]byte("routes:\n  \"POST /a\":\n    key: required\n    store_statuses: [200, 4xx]\n"))
	f.Add([]byte("routes: &a {x: *a}\n"))
	st, _ := memstore.New(nil)
	u, _ := url.Parse("http://127.0.0.1:1")
	f.Fuzz(func(t *testing.T, data []byte) {
		file, err := ParseFile("f.yaml", data, DefaultSettings())
		if err != nil {
			var ce *ConfigErrors
			if !errors.As(err, &ce) || len(ce.Errors) == 0 {
				t.Fatalf("error without problems: %v", err)
			}
			return
		}
		if _, err := New(&Config{Upstream: u, Store: st, Routes: file.ProxyRoutes()}); err != nil {
			t.Fatalf("accepted file refused by New: %v\n%s", err, data)
		}
	})
}

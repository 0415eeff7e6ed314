package proxy

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/idemhq/idem"
	"go.yaml.in/yaml/v3"
)

// MaxConfigSize bounds a configuration file.
const MaxConfigSize = 1 << 20

// File is a checked configuration file: routes with their settings
// resolved against the flags' settings.
type File struct {
	// Name is the file's path as given.
	Name string
	// Routes are the file's routes in file order.
	Routes []FileRoute
}

// FileRoute is one route of a configuration file.
type FileRoute struct {
	Route
	// Line is where the route starts in the file.
	Line int
}

// ProxyRoutes returns the routes for Config.Routes.
func (f *File) ProxyRoutes() []Route {
	rs := make([]Route, len(f.Routes))
	for i, r := range f.Routes {
		rs[i] = r.Route
	}
	return rs
}

// ConfigError is one problem in a configuration file.
type ConfigError struct {
	Line, Column int // 1-based; 0 when unknown
	Msg          string
}

// ConfigErrors are all the problems found in a configuration file. Its
// text has one line per problem, "FILE:LINE:COLUMN: message", the form
// editors and CI annotations understand.
type ConfigErrors struct {
	File   string
	Errors []ConfigError
}

func (e *ConfigErrors) Error() string {
	var b strings.Builder
	for i, ce := range e.Errors {
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(e.File)
		if ce.Line > 0 {
			fmt.Fprintf(&b, ":%d", ce.Line)
			if ce.Column > 0 {
				fmt.Fprintf(&b, ":%d", ce.Column)
			}
		}
		b.WriteString(": ")
		b.WriteString(ce.Msg)
	}
	return b.String()
}

// LoadFile reads and checks the configuration file at path. Routes inherit
// every setting they do not set from base (the flags). The error is a
// *ConfigErrors listing every problem with its line, or a read error.
func LoadFile(path string, base Settings) (*File, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxConfigSize+1))
	if err != nil {
		return nil, fmt.Errorf("config: %s: %w", path, err)
	}
	if len(data) > MaxConfigSize {
		return nil, &ConfigErrors{File: path, Errors: []ConfigError{{Msg: fmt.Sprintf("the file is larger than %d bytes", MaxConfigSize)}}}
	}
	return ParseFile(path, data, base)
}

// ParseFile checks a configuration file's content; name is used in
// messages. See LoadFile.
//
// The format is YAML:
//
//	version: 1                  # optional; the only version
//	routes:
//	  "POST /payments":         # a net/http ServeMux pattern
//	    key: required           # by-method | required | optional | off
//	    ttl: 48h
//	    release_statuses: [409]
//
// Unknown fields, duplicate fields and values of the wrong type are errors.
func ParseFile(name string, data []byte, base Settings) (*File, error) {
	p := &fileParser{file: &File{Name: name}, errs: &ConfigErrors{File: name}, base: base}
	p.parse(data)
	if len(p.errs.Errors) > 0 {
		slices.SortStableFunc(p.errs.Errors, func(a, b ConfigError) int {
			return cmp.Or(cmp.Compare(a.Line, b.Line), cmp.Compare(a.Column, b.Column))
		})
		return nil, p.errs
	}
	return p.file, nil
}

type fileParser struct {
	file *File
	errs *ConfigErrors
	base Settings
	// prefix starts every message while a route is parsed.
	prefix string
	// badPattern is set while a route whose pattern was refused is parsed.
	badPattern bool
}

func (p *fileParser) errorf(n *yaml.Node, format string, args ...any) {
	ce := ConfigError{Msg: p.prefix + fmt.Sprintf(format, args...)}
	if n != nil {
		ce.Line, ce.Column = n.Line, n.Column
	}
	p.errs.Errors = append(p.errs.Errors, ce)
}

// yamlLine finds the line number in a yaml.v3 error message.
var yamlLine = regexp.MustCompile(`line (\d+): `)

func (p *fileParser) parse(data []byte) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return // an empty file: no routes
		}
		p.syntaxError(err)
		return
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		p.errorf(&extra, "a second YAML document: the file must hold exactly one")
	} else if !errors.Is(err, io.EOF) {
		p.syntaxError(err)
	}
	if len(doc.Content) == 0 {
		return
	}
	root := resolve(doc.Content[0])
	if root.Kind == yaml.ScalarNode && root.Tag == "!!null" {
		return
	}
	if root.Kind != yaml.MappingNode {
		p.errorf(root, "the file must be a mapping with a \"routes\" field")
		return
	}
	p.fields(root, func(key string, kn, v *yaml.Node) {
		switch key {
		case "version":
			if v.Kind != yaml.ScalarNode || v.Value != "1" {
				p.errorf(v, "version: only version 1 exists")
			}
		case "routes":
			p.routes(v)
		default:
			p.errorf(kn, "unknown field %q (the top level has version and routes)", key)
		}
	})
}

// syntaxError reports a YAML error at the line its message names.
func (p *fileParser) syntaxError(err error) {
	var te *yaml.TypeError
	msgs := []string{err.Error()}
	if errors.As(err, &te) {
		msgs = te.Errors
	}
	for _, m := range msgs {
		m = strings.TrimPrefix(m, "yaml: ")
		ce := ConfigError{Msg: m}
		if loc := yamlLine.FindStringSubmatchIndex(m); loc != nil {
			ce.Line, _ = strconv.Atoi(m[loc[2]:loc[3]])
			ce.Msg = m[:loc[0]] + m[loc[1]:]
		}
		ce.Msg = "invalid YAML: " + ce.Msg
		p.errs.Errors = append(p.errs.Errors, ce)
	}
}

// resolve follows an alias to the node it names.
func resolve(n *yaml.Node) *yaml.Node {
	for n != nil && n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	return n
}

// fields calls f for every field of a mapping, in order, and reports
// duplicate and non-string keys.
func (p *fileParser) fields(m *yaml.Node, f func(key string, kn, v *yaml.Node)) {
	seen := map[string]int{}
	for i := 0; i+1 < len(m.Content); i += 2 {
		kn, v := resolve(m.Content[i]), resolve(m.Content[i+1])
		if kn.Kind != yaml.ScalarNode {
			p.errorf(kn, "a field name must be a string")
			continue
		}
		if line, dup := seen[kn.Value]; dup {
			p.errorf(kn, "%q is given twice (first on line %d)", kn.Value, line)
			continue
		}
		seen[kn.Value] = kn.Line
		f(kn.Value, kn, v)
	}
}

func (p *fileParser) routes(v *yaml.Node) {
	if v.Kind == yaml.ScalarNode && v.Tag == "!!null" {
		return
	}
	if v.Kind != yaml.MappingNode {
		p.errorf(v, "routes must be a mapping from a pattern (such as \"POST /payments\") to its settings")
		return
	}
	mux := http.NewServeMux()
	lines := map[string]int{}
	p.fields(v, func(pattern string, kn, rv *yaml.Node) {
		before := len(p.errs.Errors)
		p.badPattern = false
		if err := register(mux, pattern); err != nil {
			p.errorf(kn, "route %q: %s", pattern, patternError(err, lines))
			p.badPattern = true
		}
		lines[pattern] = kn.Line
		s, ok := p.route(pattern, kn, rv)
		if ok && len(p.errs.Errors) == before {
			p.file.Routes = append(p.file.Routes, FileRoute{Route: Route{Pattern: pattern, Settings: s}, Line: kn.Line})
		}
	})
}

// registeredAt matches the source position ServeMux adds to its messages,
// which means nothing to the file's author.
var registeredAt = regexp.MustCompile(` \(registered at [^)]*\)`)

// patternError rewords ServeMux's panic message, adding the line of a
// conflicting route.
func patternError(err error, lines map[string]int) string {
	msg := registeredAt.ReplaceAllString(err.Error(), "")
	msg = strings.ReplaceAll(strings.TrimPrefix(msg, "http: "), ":\n", ": ")
	for pat, line := range lines {
		if strings.Contains(msg, "pattern \""+pat+"\"") || strings.Contains(msg, "pattern "+strconv.Quote(pat)) {
			msg += fmt.Sprintf(" (line %d)", line)
			break
		}
	}
	return msg
}

// fieldNames are the fields a route may set, for error messages.
const fieldNames = "key, methods, lease, ttl, wait, upstream_timeout, scope_header, max_request_body, max_response_body, store_statuses, release_statuses, fingerprint_exclude, fingerprint_include"

// route parses one route's settings on top of the base settings.
func (p *fileParser) route(pattern string, kn, v *yaml.Node) (Settings, bool) {
	p.prefix = fmt.Sprintf("route %q: ", pattern)
	defer func() { p.prefix = "" }()
	s := p.base
	s.Methods = append([]string(nil), p.base.Methods...)
	if v.Kind == yaml.ScalarNode && v.Tag == "!!null" {
		p.checkRoute(pattern, kn, s, nil)
		return s, true
	}
	if v.Kind != yaml.MappingNode {
		p.errorf(v, "its settings must be a mapping (or empty)")
		return s, false
	}
	at := map[string]*yaml.Node{} // the node of each field set
	var store, release []*yaml.Node
	p.fields(v, func(key string, fk, fv *yaml.Node) {
		at[key] = fk
		switch key {
		case "key":
			if name, ok := p.scalar(fv, key); ok {
				k, known := keyNames[name]
				if !known {
					p.errorf(fv, "key: %q is not one of by-method, required, optional, off", name)
				}
				s.Key = k
			}
		case "methods":
			s.Methods = nil
			for _, item := range p.list(fv, key) {
				if err := checkMethod(item.Value); err != nil {
					p.errorf(item, "methods: %v", err)
				}
				s.Methods = append(s.Methods, item.Value)
			}
		case "lease":
			p.duration(fv, key, &s.Lease)
		case "ttl":
			p.duration(fv, key, &s.TTL)
		case "wait":
			p.duration(fv, key, &s.Wait)
		case "upstream_timeout":
			p.duration(fv, key, &s.UpstreamTimeout)
		case "scope_header":
			if fv.Kind == yaml.ScalarNode && fv.Tag == "!!null" {
				p.errorf(fv, "scope_header: give a header name, or none for no scope")
			} else if h, ok := p.scalar(fv, key); ok {
				s.ScopeHeader = ParseScopeHeader(h)
			}
		case "max_request_body":
			p.size(fv, key, &s.MaxRequestBody)
		case "max_response_body":
			p.size(fv, key, &s.MaxResponseBody)
		case "store_statuses":
			store = p.list(fv, key)
		case "release_statuses":
			release = p.list(fv, key)
		case "fingerprint_exclude", "fingerprint_include":
			var ptrs []string
			for _, item := range p.list(fv, key) {
				ptrs = append(ptrs, item.Value)
			}
			if key == "fingerprint_exclude" {
				s.FingerprintExclude = ptrs
			} else {
				s.FingerprintInclude = ptrs
			}
		default:
			p.errorf(fk, "unknown field %q (a route has %s)", key, fieldNames)
		}
	})
	if at["store_statuses"] != nil || at["release_statuses"] != nil {
		pol := &OutcomePolicy{}
		for _, list := range []struct {
			nodes []*yaml.Node
			name  string
			o     idem.Outcome
		}{{store, "store_statuses", idem.OutcomeStore}, {release, "release_statuses", idem.OutcomeRelease}} {
			for _, n := range list.nodes {
				if err := pol.add(n.Value, list.o); err != nil {
					p.errorf(n, "%s: %v", list.name, err)
				}
			}
		}
		s.Outcome = pol
	}
	if at["methods"] != nil && s.Key != idem.KeyByMethod {
		p.errorf(at["methods"], "methods applies only with key: by-method (this route has key: %s)", KeyName(s.Key))
	}
	p.checkRoute(pattern, kn, s, at)
	return s, true
}

// checkRoute reports problems with a route's resolved settings, at the
// line of the field that set the offending value, or at the route's own
// line when the value was inherited from the flags.
func (p *fileParser) checkRoute(pattern string, kn *yaml.Node, s Settings, at map[string]*yaml.Node) {
	for _, fe := range s.check() {
		if fe.field == "methods" && at["methods"] != nil && len(s.Methods) > 0 {
			continue // invalid methods were reported item by item
		}
		n := kn
		if fn := at[fe.field]; fn != nil {
			n = fn
		} else if fe.field == "ttl" && at["lease"] != nil {
			n = at["lease"] // the route's lease outgrew the inherited TTL
		}
		msg := fe.msg
		if fe.field == "ttl" && at["lease"] == nil {
			msg += " (lease comes from --lease)"
		}
		p.errorf(n, "%s", msg)
	}
	// A route whose pattern names a method that its key rule ignores would
	// protect nothing; this is almost always a mistake.
	if m, _, ok := strings.Cut(pattern, " "); ok && !p.badPattern && s.Key == idem.KeyByMethod && !containsMethod(s.Methods, m) {
		p.errorf(kn, "the pattern matches only %s, which is not among the methods that need a key (%s): set key: required, key: off, or methods", m, strings.Join(s.Methods, ", "))
	}
}

func containsMethod(methods []string, m string) bool {
	for _, x := range methods {
		if x == m || (m == http.MethodGet && x == http.MethodHead) {
			return true
		}
	}
	return false
}

// scalar returns a scalar field's text.
func (p *fileParser) scalar(v *yaml.Node, field string) (string, bool) {
	if v.Kind != yaml.ScalarNode {
		p.errorf(v, "%s: expected a single value", field)
		return "", false
	}
	return v.Value, true
}

// list returns a sequence field's scalar items.
func (p *fileParser) list(v *yaml.Node, field string) []*yaml.Node {
	if v.Kind != yaml.SequenceNode {
		p.errorf(v, "%s: expected a list, such as [a, b]", field)
		return nil
	}
	items := make([]*yaml.Node, 0, len(v.Content))
	for _, it := range v.Content {
		it = resolve(it)
		if it.Kind != yaml.ScalarNode {
			p.errorf(it, "%s: expected a single value in the list", field)
			continue
		}
		items = append(items, it)
	}
	return items
}

func (p *fileParser) duration(v *yaml.Node, field string, dst *time.Duration) {
	text, ok := p.scalar(v, field)
	if !ok {
		return
	}
	d, err := time.ParseDuration(text)
	if err != nil {
		p.errorf(v, "%s: %q is not a duration (write it with a unit, such as 500ms, 30s or 24h)", field, text)
		return
	}
	*dst = d
}

func (p *fileParser) size(v *yaml.Node, field string, dst *int64) {
	text, ok := p.scalar(v, field)
	if !ok {
		return
	}
	n, err := ParseSize(text)
	if err != nil {
		p.errorf(v, "%s: %v", field, err)
		return
	}
	*dst = n
}

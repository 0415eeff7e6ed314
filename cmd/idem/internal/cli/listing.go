package cli

import (
	"bufio"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/idemhq/idem/idemstore"
)

// How idem ls and idem inspect print records: a table or key/value lines
// for people, JSON for programs. Every string from a record goes through
// termField, termText or, in JSON, jsonString and escapeJSON.

// recordWriter prints idem ls's records as pages arrive, holding at most
// one page.
type recordWriter interface {
	// write prints one page of records.
	write(recs []idemstore.RecordInfo) error
	// end finishes the listing; next is the cursor that goes on after it,
	// "" when the listing is complete.
	end(next string) error
}

// column is one column of idem ls's table. A new column is one more entry
// in lsColumns.
type column struct {
	title string
	value func(idemstore.RecordInfo) string
}

// lsColumns returns idem ls's table columns: records are named by scope
// and key, or by ID on a store that keeps those only hashed.
func lsColumns(hashed bool) []column {
	cols := []column{
		{"STATE", func(r idemstore.RecordInfo) string {
			if r.Held() {
				return "held"
			}
			return termField(r.State.String())
		}},
		{"EXPIRES AT", func(r idemstore.RecordInfo) string { return r.ExpiresAt.Format(time.RFC3339) }},
		{"LEASE UNTIL", func(r idemstore.RecordInfo) string {
			if r.State != idemstore.StateInFlight || r.Held() {
				return "-"
			}
			return r.LeaseExpiresAt.Format(time.RFC3339)
		}},
		{"SIZE", func(r idemstore.RecordInfo) string { return strconv.Itoa(r.ResponseSize) }},
	}
	if hashed {
		return append(cols, column{"ID", func(r idemstore.RecordInfo) string { return termField(r.ID) }})
	}
	return append(cols,
		column{"SCOPE", func(r idemstore.RecordInfo) string { return termField(r.Scope) }},
		column{"KEY", func(r idemstore.RecordInfo) string { return termField(r.Key) }})
}

// tableWriter prints idem ls's table. Columns are aligned within each page
// (a tabwriter holds one page at a time), so that memory stays bounded.
type tableWriter struct {
	out    *bufio.Writer
	cols   []column
	header bool // printed
}

func newTableWriter(w io.Writer, hashed bool) *tableWriter {
	return &tableWriter{out: bufio.NewWriter(w), cols: lsColumns(hashed)}
}

func newTable(w io.Writer, padding int) *tabwriter.Writer {
	return tabwriter.NewWriter(w, 0, 4, padding, ' ', 0)
}

func (t *tableWriter) write(recs []idemstore.RecordInfo) error {
	tw := newTable(t.out, 2)
	if !t.header {
		t.header = true
		for i, c := range t.cols {
			fmt.Fprint(tw, sep(i), c.title)
		}
		fmt.Fprintln(tw)
	}
	for _, r := range recs {
		for i, c := range t.cols {
			fmt.Fprint(tw, sep(i), c.value(r))
		}
		fmt.Fprintln(tw)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	return t.out.Flush()
}

func sep(i int) string {
	if i == 0 {
		return ""
	}
	return "\t"
}

func (t *tableWriter) end(string) error {
	if !t.header {
		return t.write(nil)
	}
	return t.out.Flush()
}

// jsonWriter prints idem ls --json: one object, {"records": [...], "next":
// CURSOR}, written record by record.
type jsonWriter struct {
	out *bufio.Writer
	n   int
}

func newJSONWriter(w io.Writer) *jsonWriter {
	j := &jsonWriter{out: bufio.NewWriter(w)}
	j.out.WriteString("{\n  \"records\": [")
	return j
}

func (j *jsonWriter) write(recs []idemstore.RecordInfo) error {
	for _, r := range recs {
		b, err := json.MarshalIndent(toJSON(r, false), "    ", "  ")
		if err != nil {
			return err
		}
		if j.n > 0 {
			j.out.WriteByte(',')
		}
		j.n++
		j.out.WriteString("\n    ")
		j.out.Write(escapeJSON(b))
	}
	return j.out.Flush()
}

func (j *jsonWriter) end(next string) error {
	if j.n > 0 {
		j.out.WriteString("\n  ")
	}
	b, _ := json.Marshal(next) // a cursor is printable ASCII
	fmt.Fprintf(j.out, "],\n  \"next\": %s\n}\n", b)
	return j.out.Flush()
}

// recordJSON is the --json form of a record (docs/operations.md lists its
// fields).
type recordJSON struct {
	// Scope, Key and ID are the values themselves, or, for one that is not
	// UTF-8 or starts with a double quote, the quoted form idem ls prints
	// (then ScopeQuoted, KeyQuoted or IDQuoted is true). Either way
	// --scope and KEY take them as they are.
	Scope              string     `json:"scope,omitempty"`
	ScopeQuoted        bool       `json:"scopeQuoted,omitempty"`
	Key                string     `json:"key,omitempty"`
	KeyQuoted          bool       `json:"keyQuoted,omitempty"`
	ID                 string     `json:"id,omitempty"`
	IDQuoted           bool       `json:"idQuoted,omitempty"`
	State              string     `json:"state"`
	Fingerprint        string     `json:"fingerprint"`
	FingerprintVersion string     `json:"fingerprintVersion"`
	ExpiresAt          time.Time  `json:"expiresAt"`
	LeaseExpiresAt     *time.Time `json:"leaseExpiresAt,omitempty"`
	// Held marks an in-flight record held for an operator (reconciliation
	// gave up on it).
	Held         bool `json:"held,omitempty"`
	ResponseSize int  `json:"responseSize"`
	Status       int  `json:"status,omitempty"`
	BodySize     *int `json:"bodySize,omitempty"`
	Unreplayable bool `json:"unreplayable,omitempty"`
	// Header holds the stored header fields (with --show-body); a name or
	// value that is not UTF-8 has its other bytes written as \xNN.
	Header map[string][]string `json:"header,omitempty"`
	// Body is the stored body (with --show-body), exactly: as text when
	// BodyEncoding is "utf-8", in standard base64 when it is "base64" (a
	// body that is not UTF-8 text).
	Body         *string `json:"body,omitempty"`
	BodyEncoding string  `json:"bodyEncoding,omitempty"`
	// Encryption says whether the stored response is encrypted and
	// whether --encryption-keys decrypted it; absent for one stored in
	// clear.
	Encryption string `json:"encryption,omitempty"`
	// Steps are the steps of an in-flight record's recovery point (with
	// their data under --show-body).
	Steps []stepJSON `json:"steps,omitempty"`
}

func toJSON(r idemstore.RecordInfo, showBody bool) recordJSON {
	j := recordJSON{State: r.State.String(), Fingerprint: r.Fingerprint,
		FingerprintVersion: r.FingerprintVersion(), ExpiresAt: r.ExpiresAt, ResponseSize: r.ResponseSize}
	j.Scope, j.ScopeQuoted = jsonString(r.Scope)
	j.Key, j.KeyQuoted = jsonString(r.Key)
	j.ID, j.IDQuoted = jsonString(r.ID)
	j.Fingerprint, j.FingerprintVersion = utf8Text(r.Fingerprint), utf8Text(j.FingerprintVersion)
	switch {
	case r.Held():
		j.Held = true
		j.Steps = stepsJSON(r, showBody)
	case r.State == idemstore.StateInFlight:
		j.LeaseExpiresAt = &r.LeaseExpiresAt
		j.Steps = stepsJSON(r, showBody)
	}
	if resp := r.Response; resp != nil {
		n := len(resp.Body)
		j.Status, j.BodySize, j.Unreplayable = resp.StatusCode, &n, resp.Unreplayable
		if showBody {
			j.Header = make(map[string][]string, len(resp.Header))
			for k, vs := range resp.Header {
				k = utf8Text(k)
				for _, v := range vs {
					j.Header[k] = append(j.Header[k], utf8Text(v))
				}
			}
			body, enc := string(resp.Body), "utf-8"
			if !utf8.Valid(resp.Body) {
				body, enc = base64.StdEncoding.EncodeToString(resp.Body), "base64"
			}
			j.Body, j.BodyEncoding = &body, enc
		}
	}
	return j
}

// utf8Text returns s for a JSON string: as it is when it is UTF-8 (JSON
// escapes its controls), with each byte that is not written as \xNN
// otherwise (encoding/json would silently replace them).
func utf8Text(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	var b []byte
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = fmt.Appendf(b, `\x%02x`, s[i])
		} else {
			b = append(b, s[i:i+size]...)
		}
		i += size
	}
	return string(b)
}

// bodyText returns a stored body as idem inspect --show-body prints it, and
// how it is shown: UTF-8 text with its control characters escaped, or
// base64 for a body that is not UTF-8 text (a binary or compressed body).
func bodyText(body []byte) (string, string) {
	switch {
	case len(body) == 0:
		return "", "empty"
	case !utf8.Valid(body):
		enc := base64.StdEncoding.EncodeToString(body)
		var b []byte
		for len(enc) > 76 {
			b = append(append(b, enc[:76]...), '\n')
			enc = enc[76:]
		}
		return string(append(append(b, enc...), '\n')), "in base64 (it is not UTF-8 text; --json gives it too)"
	}
	text, n := termText(string(body), true)
	if n == 0 {
		return text, "as text"
	}
	return text, fmt.Sprintf("as text, %d control characters escaped as \\xNN or \\uNNNN (--json gives the exact body)", n)
}

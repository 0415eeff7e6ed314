package console

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemcrypt"
	"github.com/idemhq/idem/idemstore"
	"github.com/idemhq/idem/outbox"
)

// Bounds of the pages' parameters.
const (
	defaultPageSize = 50
	maxPageSize     = 500
	maxScopeLen     = 1024
	maxKeyLen       = 1024
	// pageTimeout bounds the store's work for one page.
	pageTimeout = 10 * time.Second
)

func parseTemplates() (map[string]*template.Template, error) {
	funcs := template.FuncMap{
		"ago":   ago,
		"at":    func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05.000 UTC") },
		"count": countText,
		"text":  printable,
		"short": func(s string) string { return s[:min(len(s), 12)] },
	}
	names, err := fs.Glob(templateFiles, "templates/*.html")
	if err != nil {
		return nil, err
	}
	pages := map[string]*template.Template{}
	for _, n := range names {
		name := strings.TrimSuffix(path.Base(n), ".html")
		if name == "layout" || name == "parts" {
			continue
		}
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(templateFiles, "templates/layout.html", "templates/parts.html", n)
		if err != nil {
			return nil, fmt.Errorf("console: template %s: %w", n, err)
		}
		pages[name] = t
	}
	return pages, nil
}

// page is what every template gets.
type page struct {
	Title    string
	Nav      string
	CSRF     string
	HasToken bool
	LoggedIn bool
	Outbox   bool
	Store    string
	Data     any
}

// render writes a page. Pages show records, so none is cached.
func (c *Console) render(w http.ResponseWriter, r *http.Request, status int, name string, s session, data any) {
	t := c.pages[name]
	p := page{Title: c.cfg.Title, Nav: name, HasToken: c.token != "", LoggedIn: s.id != "", Outbox: c.ob != nil,
		Store: c.info.Kind, Data: data}
	if s.id != "" {
		p.CSRF = c.csrfToken(s)
	}
	var buf bytes.Buffer
	if err := t.Execute(&buf, p); err != nil {
		c.cfg.Logger.Error("console: rendering a page failed", "page", name, "error", err)
		http.Error(w, "internal error: the page could not be rendered", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// fail renders an error page; a store failure is logged.
func (c *Console) fail(w http.ResponseWriter, r *http.Request, s session, status int, err error) {
	if status >= 500 {
		c.cfg.Logger.Error("console: a page failed", "path", r.URL.Path, "error", err)
	}
	c.render(w, r, status, "error", s, map[string]any{"Status": status, "StatusText": http.StatusText(status), "Error": err.Error()})
}

// badInput is a request whose parameters are wrong: 400.
type badInput struct{ error }

func bad(format string, args ...any) error { return badInput{fmt.Errorf(format, args...)} }

// storeFailed answers an error of the store (or of the request).
func (c *Console) storeFailed(w http.ResponseWriter, r *http.Request, s session, err error) {
	var bi badInput
	var bq errBadQuery
	switch {
	case errors.As(err, &bi), errors.As(err, &bq):
		c.fail(w, r, s, http.StatusBadRequest, err)
	case errors.Is(err, context.DeadlineExceeded):
		c.fail(w, r, s, http.StatusGatewayTimeout, fmt.Errorf("the store did not answer within %v: %w", pageTimeout, err))
	default:
		c.fail(w, r, s, http.StatusServiceUnavailable, fmt.Errorf("the store failed: %w", err))
	}
}

// query validates a GET's query: only the allowed parameters, each once.
func query(r *http.Request, allowed ...string) (url.Values, error) {
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return nil, bad("unreadable query: %v", err)
	}
	for k, vs := range q {
		ok := false
		for _, a := range allowed {
			ok = ok || k == a
		}
		if !ok {
			return nil, bad("unknown query parameter %q", k)
		}
		if len(vs) > 1 {
			return nil, bad("query parameter %q given %d times", k, len(vs))
		}
	}
	return q, nil
}

// overviewData is the overview's content.
type overviewData struct {
	Summary     Summary
	OldestID    string
	OldestEnded bool
	Total       int64
	TotalExact  bool
	TotalAt     time.Time
	Counting    bool
	Completed   int64
	Backlog     int64
	OldestMsg   *outbox.PendingMessage
	OutboxErr   string
	Rates       bool
	Now         time.Time
	Info        SourceInfo
	Cap         int
}

func (c *Console) overview(w http.ResponseWriter, r *http.Request, s session) {
	if _, err := query(r); err != nil {
		c.fail(w, r, s, http.StatusBadRequest, err)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), pageTimeout)
	defer cancel()
	now := c.cfg.NowFunc()
	sum, err := c.src.Summary(ctx, now)
	if err != nil {
		c.storeFailed(w, r, s, err)
		return
	}
	d := overviewData{Summary: sum, Rates: c.cfg.Rates != nil, Now: now, Info: c.info, Cap: SummaryCap}
	if sum.Oldest != nil {
		d.OldestID = c.remember(*sum.Oldest)
		d.OldestEnded = sum.Oldest.leaseEnded(now)
	}
	c.total.Lock()
	stale := now.Sub(c.total.at) > totalMaxAge
	c.total.Unlock()
	if stale {
		// A small store is counted before the page answers; a large one
		// is shown as being counted.
		done := c.countTotal()
		t := time.NewTimer(firstCountWait)
		select {
		case <-done:
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
	}
	c.total.Lock()
	d.Total, d.TotalExact, d.TotalAt, d.Counting = c.total.n, c.total.exact, c.total.at, c.total.at.IsZero()
	c.total.Unlock()
	d.Now = c.cfg.NowFunc() // the count may have ended after now
	if !d.Counting {
		d.Completed = max(0, d.Total-sum.InFlight-sum.Expired)
	}
	if c.ob != nil {
		n, oldest, err := c.ob.Backlog(ctx)
		if err != nil {
			d.OutboxErr = err.Error()
		}
		d.Backlog, d.OldestMsg = n, oldest
	}
	c.render(w, r, http.StatusOK, "overview", s, d)
}

// firstCountWait is how long the overview waits for a count it started.
const firstCountWait = 20 * time.Millisecond

// countTotal counts every record in the background, once at a time, and
// returns a channel closed when the count running now ends.
func (c *Console) countTotal() <-chan struct{} {
	c.total.Lock()
	defer c.total.Unlock()
	if c.total.running != nil || c.ctx.Err() != nil {
		if c.total.running != nil {
			return c.total.running
		}
		return nil
	}
	done := make(chan struct{})
	c.total.running = done
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		defer close(done)
		ctx, cancel := context.WithTimeout(c.ctx, time.Minute)
		n, exact, err := c.src.Total(ctx)
		cancel()
		c.total.Lock()
		defer c.total.Unlock()
		c.total.running = nil
		if err != nil {
			if c.ctx.Err() == nil {
				c.cfg.Logger.Warn("console: counting the records failed", "error", err)
			}
			return
		}
		c.total.n, c.total.exact, c.total.at = n, exact, c.cfg.NowFunc()
	}()
	return done
}

// remember records a row's name under its id and returns the id.
func (c *Console) remember(r Row) string {
	return c.refs.remember(c.src.ID(r), r.Ref())
}

// recordsData is the Records page's content.
type recordsData struct {
	Rows   []rowView
	State  State
	Scope  string
	Older  string
	Limit  int
	Next   string
	Index  string
	Note   string
	Info   SourceInfo
	States []State
	TTL    time.Duration
	Now    time.Time
}

// rowView is a listed record.
type rowView struct {
	Row
	ConsoleID string
	Status    string
	Claimed   time.Time
}

// stateText describes a record's state.
func stateText(r Row, now time.Time) string {
	switch {
	case r.State == idemstore.StateCompleted && !r.ExpiresAt.After(now):
		return "expired, awaiting cleanup"
	case r.State == idemstore.StateCompleted:
		return "completed"
	case !r.ExpiresAt.After(now):
		return "expired in flight, awaiting cleanup"
	case r.Held():
		return "held for an operator: reconciliation gave up on it"
	case r.suspended(now):
		return "suspended after a step"
	case r.leaseEnded(now):
		return "in flight, owner gone (lease ended)"
	}
	return "in flight, lease live"
}

// parseQuery reads the Records page's filters.
func (c *Console) parseQuery(r *http.Request, now time.Time) (Query, recordsData, error) {
	q, err := query(r, "state", "scope", "older", "after", "limit")
	if err != nil {
		return Query{}, recordsData{}, err
	}
	d := recordsData{State: State(q.Get("state")), Scope: q.Get("scope"), Older: q.Get("older"), Limit: defaultPageSize}
	out := Query{State: d.State, Scope: d.Scope, Limit: defaultPageSize}
	switch d.State {
	case AnyState, StateInFlight, StateSuspended, StateHeld, StateCompleted, StateExpired:
	default:
		return out, d, bad("state must be in-flight, suspended, completed or expired, not %q", d.State)
	}
	if len(d.Scope) > maxScopeLen || !utf8.ValidString(d.Scope) {
		return out, d, bad("scope is over %d bytes or not UTF-8", maxScopeLen)
	}
	if d.Older != "" {
		age, err := time.ParseDuration(d.Older)
		if err != nil || age <= 0 || age > idem.MaxTTL {
			return out, d, bad("older must be a positive duration such as 10m or 24h, not %q", d.Older)
		}
		// Claimed more than age ago: the retention ends before
		// now - age + TTL.
		out.Before = now.Add(c.cfg.TTL - age)
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxPageSize {
			return out, d, bad("limit must be between 1 and %d, not %q", maxPageSize, v)
		}
		out.Limit, d.Limit = n, n
	}
	if v := q.Get("after"); v != "" {
		cur, err := c.parseCursor(v)
		if err != nil {
			return out, d, err
		}
		out.After = cur
	}
	return out, d, nil
}

// cursorRefPrefix marks the store cursors the console remembers among
// its record ids.
const cursorRefPrefix = "cursor:"

// formatCursor writes a cursor for a URL: the sort value and the last
// row's id (its name stays in the console's memory), or the digest of a
// store's cursor (the cursor stays in the console's memory).
func (c *Console) formatCursor(cur *Cursor) string {
	if cur == nil {
		return ""
	}
	if cur.Token != "" {
		// A store's cursor may name a record (memstore's holds its
		// scope and key): the URL carries a digest, the console keeps
		// the cursor.
		sum := sha256.Sum256([]byte(cur.Token))
		d := hex.EncodeToString(sum[:16])
		c.refs.remember(cursorRefPrefix+d, Ref{StoreID: cur.Token})
		return "t" + d
	}
	id := c.refs.remember(RecordID(cur.Scope, cur.Key), Ref{Scope: cur.Scope, Key: cur.Key})
	return strconv.FormatInt(cur.Sort, 10) + "." + id
}

func (c *Console) parseCursor(v string) (*Cursor, error) {
	if d, ok := strings.CutPrefix(v, "t"); ok {
		if len(d) != 32 || strings.Trim(d, "0123456789abcdef") != "" {
			return nil, bad("after: bad cursor %q", v)
		}
		ref, ok := c.refs.lookup(cursorRefPrefix + d)
		if !ok || ref.StoreID == "" {
			return nil, bad("after: this page link expired (the console restarted or forgot it); start from the first page")
		}
		return &Cursor{Token: ref.StoreID}, nil
	}
	sort, id, ok := strings.Cut(v, ".")
	n, err := strconv.ParseInt(sort, 10, 64)
	if !ok || err != nil || !validID(id) {
		return nil, bad("after: bad cursor %q", v)
	}
	ref, ok := c.refs.lookup(id)
	if !ok || !ref.named() {
		return nil, bad("after: this page link expired (the console restarted or forgot it); start from the first page")
	}
	return &Cursor{Sort: n, Scope: ref.Scope, Key: ref.Key}, nil
}

func (c *Console) records(w http.ResponseWriter, r *http.Request, s session) {
	now := c.cfg.NowFunc()
	q, d, err := c.parseQuery(r, now)
	if err != nil {
		c.fail(w, r, s, http.StatusBadRequest, err)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), pageTimeout)
	defer cancel()
	p, err := c.src.List(ctx, q, now)
	if err != nil {
		c.storeFailed(w, r, s, err)
		return
	}
	d.Info, d.Index, d.Note, d.TTL, d.Now = c.info, p.Index, p.Note, c.cfg.TTL, now
	d.States = []State{AnyState, StateInFlight, StateSuspended, StateHeld, StateCompleted, StateExpired}
	for _, row := range p.Rows {
		d.Rows = append(d.Rows, c.view(row, now))
	}
	if p.Next != nil {
		v := url.Values{}
		for k, val := range map[string]string{"state": string(d.State), "scope": d.Scope, "older": d.Older} {
			if val != "" {
				v.Set(k, val)
			}
		}
		if d.Limit != defaultPageSize {
			v.Set("limit", strconv.Itoa(d.Limit))
		}
		v.Set("after", c.formatCursor(p.Next))
		d.Next = "/records?" + v.Encode()
	}
	c.render(w, r, http.StatusOK, "records", s, d)
}

func (c *Console) view(row Row, now time.Time) rowView {
	v := rowView{Row: row, ConsoleID: c.remember(row), Status: stateText(row, now)}
	v.Claimed = row.ExpiresAt.Add(-c.cfg.TTL)
	return v
}

// search finds a key (sent in the form, never in a URL) and shows its
// record, or the records holding it in several scopes.
func (c *Console) search(w http.ResponseWriter, r *http.Request, s session) {
	key, scope := r.PostFormValue("key"), r.PostFormValue("scope")
	switch {
	case key == "":
		c.fail(w, r, s, http.StatusBadRequest, errors.New("give a key to look for"))
		return
	case len(key) > maxKeyLen || len(scope) > maxScopeLen || !utf8.ValidString(key) || !utf8.ValidString(scope):
		c.fail(w, r, s, http.StatusBadRequest, fmt.Errorf("the key or scope is over %d bytes or not UTF-8", maxKeyLen))
		return
	}
	if c.cfg.Encryption != nil && scope != "" {
		// With hashed names (EncryptionConfig.HashKey) records are stored
		// under digests of the scope and key; otherwise StoredKey returns
		// them as given.
		scope, key = c.cfg.Encryption.StoredKey(scope, key)
	}
	ctx, cancel := context.WithTimeout(r.Context(), pageTimeout)
	defer cancel()
	now := c.cfg.NowFunc()
	rows, note, err := c.src.Find(ctx, scope, key, now)
	err = redactKey(err, key)
	if err != nil {
		c.storeFailed(w, r, s, err)
		return
	}
	if len(rows) == 1 && note == "" {
		http.Redirect(w, r, "/records/"+c.remember(rows[0]), http.StatusSeeOther)
		return
	}
	d := recordsData{Note: note, Info: c.info, TTL: c.cfg.TTL, Now: now, Index: "search"}
	for _, row := range rows {
		d.Rows = append(d.Rows, c.view(row, now))
	}
	c.render(w, r, http.StatusOK, "found", s, d)
}

// resolve returns the Ref of a record id in a URL.
func (c *Console) resolve(id string) (Ref, error) {
	if !validID(id) {
		return Ref{}, bad("%q is not a record id", id)
	}
	if ref, ok := c.refs.lookup(id); ok {
		return ref, nil
	}
	if ref, ok := c.src.RefOf(id); ok {
		return ref, nil
	}
	return Ref{}, errUnknownID
}

var errUnknownID = errors.New("this console does not know this record id (it restarted, or the link is old): search for the key")

// recordData is a record's page.
type recordData struct {
	rowView
	ID           string
	State        string
	InFlight     bool
	FPVersion    string
	Steps        []stepView
	StepsNote    string
	HeldReason   string
	Response     *idem.Response
	Headers      []headerView
	Body         string
	BodyShown    bool
	RespNote     string
	CanDelete    bool
	CanRelease   bool
	CanReconcile bool
	Done         string
	Derived      bool
	Info         SourceInfo
	Now          time.Time
	TTL          time.Duration
}

type stepView struct {
	Name, Status, Derived, Data string
}

type headerView struct{ Name, Value string }

func (c *Console) record(w http.ResponseWriter, r *http.Request, s session) {
	q, err := query(r, "done")
	if err != nil {
		c.fail(w, r, s, http.StatusBadRequest, err)
		return
	}
	id := r.PathValue("id")
	row, status, err := c.load(r.Context(), id)
	if err != nil {
		c.loadFailed(w, r, s, status, err)
		return
	}
	now := c.cfg.NowFunc()
	d := c.detail(r.Context(), id, row, now)
	switch done := q.Get("done"); done {
	case "", "released", "reconciled":
		d.Done = done
	default:
		c.fail(w, r, s, http.StatusBadRequest, bad("unknown done %q", done))
		return
	}
	c.render(w, r, http.StatusOK, "record", s, d)
}

// load reads a record by id.
func (c *Console) load(ctx context.Context, id string) (Row, int, error) {
	ref, err := c.resolve(id)
	if err != nil {
		if errors.Is(err, errUnknownID) {
			return Row{}, http.StatusNotFound, err
		}
		return Row{}, http.StatusBadRequest, err
	}
	ctx, cancel := context.WithTimeout(ctx, pageTimeout)
	defer cancel()
	row, err := c.src.Get(ctx, ref, c.cfg.NowFunc())
	if errors.Is(err, idemstore.ErrNotFound) {
		return Row{}, http.StatusNotFound, errors.New("no unexpired record has this id (deleted, released or expired)")
	}
	if err != nil {
		return Row{}, http.StatusServiceUnavailable, fmt.Errorf("the store failed: %w", err)
	}
	if ref.named() && row.Scope == "" && row.Key == "" {
		row.Scope, row.Key = ref.Scope, ref.Key
	}
	return row, http.StatusOK, nil
}

func (c *Console) loadFailed(w http.ResponseWriter, r *http.Request, s session, status int, err error) {
	c.fail(w, r, s, status, err)
}

// detail builds a record's page: its response and recovery point opened
// with the console's keys where it has them.
func (c *Console) detail(ctx context.Context, id string, row Row, now time.Time) recordData {
	d := recordData{rowView: c.view(row, now), ID: id, State: stateText(row, now), InFlight: row.State == idemstore.StateInFlight,
		FPVersion: row.FingerprintVersion(), Info: c.info, Now: now, TTL: c.cfg.TTL, Derived: c.cfg.DeriveKeyFunc != nil}
	d.ConsoleID = id
	d.CanDelete = row.State == idemstore.StateCompleted
	d.CanRelease = row.leaseEnded(now)
	d.CanReconcile = c.cfg.ReconcileFunc != nil && row.suspended(now) && row.Scope != ""
	if row.Response != nil {
		resp, note := c.openResponse(ctx, row)
		d.RespNote = note
		if resp != nil {
			d.Response = resp
			for _, k := range sortedKeys(resp.Header) {
				for _, v := range resp.Header[k] {
					d.Headers = append(d.Headers, headerView{k, printable([]byte(v))})
				}
			}
			if c.cfg.ShowBody {
				d.Body, d.BodyShown = printable(resp.Body), true
			}
		}
	}
	if row.State == idemstore.StateInFlight {
		var cp idem.CheckpointInfo
		d.Steps, d.StepsNote, cp = c.steps(ctx, row)
		if row.Held() {
			d.HeldReason = heldReason(cp, now)
		}
	}
	return d
}

// openResponse returns the stored response in clear, or nil and why not.
func (c *Console) openResponse(ctx context.Context, row Row) (*idem.Response, string) {
	var none *idemcrypt.Encryption // opens exactly the responses stored in clear
	if resp, err := none.Open(ctx, row.Scope, row.Key, row.Response); err == nil {
		return resp, ""
	}
	if c.cfg.Encryption == nil {
		return nil, "The stored response is encrypted: start the console with --encryption-keys to read it."
	}
	resp, err := c.cfg.Encryption.Open(ctx, row.Scope, row.Key, row.Response)
	if err != nil {
		return nil, "The stored response is encrypted and these keys do not open it: " + err.Error()
	}
	return resp, "Encrypted; opened with the console's keys."
}

// steps returns a record's steps, from its recovery point opened as the
// response is, with their derived keys where the console knows the secret.
func (c *Console) steps(ctx context.Context, row Row) ([]stepView, string, idem.CheckpointInfo) {
	cp := row.Checkpoint
	note := ""
	if len(cp) > 0 {
		var none *idemcrypt.Encryption
		if plain, err := none.OpenCheckpoint(ctx, row.Scope, row.Key, row.Fingerprint, cp); err == nil {
			cp = plain
		} else if c.cfg.Encryption == nil {
			return nil, "The recovery point is encrypted: start the console with --encryption-keys to read its steps.", idem.CheckpointInfo{}
		} else if plain, err := c.cfg.Encryption.OpenCheckpoint(ctx, row.Scope, row.Key, row.Fingerprint, cp); err != nil {
			return nil, "The recovery point is encrypted and these keys do not open it: " + err.Error(), idem.CheckpointInfo{}
		} else {
			cp, note = plain, "Encrypted; opened with the console's keys."
		}
	}
	info, err := idem.ParseCheckpointInfo(cp)
	if err != nil {
		return nil, "The recovery point is unreadable: " + err.Error(), idem.CheckpointInfo{}
	}
	steps := info.Steps
	var out []stepView
	seen := map[string]bool{}
	add := func(name, status string, data []byte) {
		v := stepView{Name: name, Status: status}
		if c.cfg.DeriveKeyFunc != nil && row.Scope != "" {
			v.Derived = c.cfg.DeriveKeyFunc(row.Scope, row.Key, name)
		}
		if c.cfg.ShowBody && data != nil {
			v.Data = printable(data)
		}
		out = append(out, v)
		seen[name] = true
	}
	for _, st := range steps {
		switch {
		case st.Done:
			add(st.Name, "done", st.Data)
		case st.Unknown:
			add(st.Name, "outcome unknown", nil)
		default:
			add(st.Name, "pending", nil)
		}
	}
	for _, n := range c.cfg.StepNames {
		if !seen[n] {
			add(n, "pending", nil)
		}
	}
	if len(out) == 0 && note == "" {
		note = "No step has been recorded."
	}
	return out, note, info
}

func sortedKeys(h http.Header) []string {
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	for i := 1; i < len(keys); i++ {
		for j := i; j > 0 && keys[j] < keys[j-1]; j-- {
			keys[j], keys[j-1] = keys[j-1], keys[j]
		}
	}
	return keys
}

// ago says how far t is from now ("3s ago", "in 2m").
func ago(t, now time.Time) string {
	d := now.Sub(t)
	switch {
	case d >= 0:
		return roundDur(d) + " ago"
	default:
		return "in " + roundDur(-d)
	}
}

func roundDur(d time.Duration) string {
	switch {
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Hour:
		return d.Round(time.Second).String()
	}
	return d.Round(time.Minute).String()
}

// countText writes a capped count.
func countText(n int64, capped bool) string {
	if capped && n >= SummaryCap {
		return "more than " + strconv.Itoa(SummaryCap)
	}
	return strconv.FormatInt(n, 10)
}

// outboxData is the Outbox page.
type outboxData struct {
	Messages []outbox.PendingMessage
	Next     string
	Backlog  int64
	ShowBody bool
	Now      time.Time
	Done     bool
}

func (c *Console) outboxPage(w http.ResponseWriter, r *http.Request, s session) {
	if c.ob == nil {
		c.fail(w, r, s, http.StatusNotFound, errors.New("this store holds no outbox"))
		return
	}
	q, err := query(r, "after", "done")
	if err != nil {
		c.fail(w, r, s, http.StatusBadRequest, err)
		return
	}
	var after int64
	if v := q.Get("after"); v != "" {
		if after, err = strconv.ParseInt(v, 10, 64); err != nil || after < 0 {
			c.fail(w, r, s, http.StatusBadRequest, bad("after must be a sequence number, not %q", v))
			return
		}
	}
	d := outboxData{ShowBody: c.cfg.ShowBody, Now: c.cfg.NowFunc()}
	switch q.Get("done") {
	case "":
	case "retried":
		d.Done = true
	default:
		c.fail(w, r, s, http.StatusBadRequest, bad("unknown done %q", q.Get("done")))
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), pageTimeout)
	defer cancel()
	if d.Backlog, _, err = c.ob.Backlog(ctx); err != nil {
		c.storeFailed(w, r, s, err)
		return
	}
	msgs, err := c.ob.ListPending(ctx, outbox.ListPendingParams{After: after, Limit: defaultPageSize + 1, WithPayload: c.cfg.ShowBody})
	if err != nil {
		c.storeFailed(w, r, s, err)
		return
	}
	if len(msgs) > defaultPageSize {
		msgs = msgs[:defaultPageSize]
		d.Next = "/outbox?after=" + strconv.FormatInt(msgs[len(msgs)-1].Seq, 10)
	}
	d.Messages = msgs
	c.render(w, r, http.StatusOK, "outbox", s, d)
}

// heldReason says why reconciliation gave up on a held record, from what
// its recovery point counts.
func heldReason(cp idem.CheckpointInfo, now time.Time) string {
	why := "Reconciliation gave up on it"
	if cp.Attempts > 0 {
		why += fmt.Sprintf(" after %d attempts without an outcome", cp.Attempts)
	}
	if !cp.Since.IsZero() {
		why += fmt.Sprintf(", its first recovery point saved %s (%s)", ago(cp.Since, now), cp.Since.UTC().Format(time.RFC3339))
	}
	for _, st := range cp.Steps {
		if st.Unknown {
			why += fmt.Sprintf("; step %q ended with an unknown outcome", st.Name)
			break
		}
	}
	return why + ". The reconciler no longer resumes it; a retry with its key, or Reconcile now, still does."
}

// Package console is idem's operator console: server-rendered pages
// (html/template, embedded assets, a little JavaScript, no build step, no
// external assets) over a records store, mounted by `idem console` and by
// --console-addr on `idem serve` and `idem proxy`.
//
// The pages: an overview (records by state, the oldest in-flight lease,
// the outbox backlog, live rates inside serve and proxy), a records list
// with filters and keyset paging, a record's page (state, lease, fence,
// steps and their derived keys, the stored response's status and header
// fields; its body only with Config.ShowBody), the unsent outbox
// messages, and actions behind a confirmation step: delete a completed
// record, release an in-flight one whose owner is gone, retry an outbox
// message now, reconcile a suspended payment (serve --provider).
//
// Safety: records are named by a hash (RecordID), never by their key, in
// URLs; without a token the console answers only requests to a loopback
// host; with one, every page needs it (a bearer token, or a login form
// that sets an HttpOnly, SameSite=Strict cookie); every POST carries the
// session's CSRF token and is refused from another origin; every action is
// logged with who, what and when, the key redacted (idem.RedactKey); pages
// carry a strict Content-Security-Policy, X-Frame-Options DENY and
// Cache-Control no-store.
package console

import (
	"context"
	"crypto/rand"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/cmd/idem/internal/backend"
	"github.com/idemhq/idem/cmd/idem/internal/metrics"
	"github.com/idemhq/idem/idemcrypt"
	"github.com/idemhq/idem/idemstore"
	"github.com/idemhq/idem/mysqlstore/mysqloutbox"
	"github.com/idemhq/idem/outbox"
	"github.com/idemhq/idem/pgstore"
	"github.com/idemhq/idem/pgstore/pgoutbox"
	"github.com/idemhq/idem/sqlitestore/sqliteoutbox"
	"golang.org/x/time/rate"
)

//go:embed templates/*.html
var templateFiles embed.FS

//go:embed static
var staticFiles embed.FS

// Config configures a Console.
type Config struct {
	// Store is the records store. Required.
	Store *backend.Store
	// Spec is the --store or --db value Store was opened from (for the
	// outbox's PostgreSQL schema); never shown.
	Spec string
	// Outbox is the outbox next to the records. Nil: the console looks
	// for one in the store's database (sqliteoutbox's or pgoutbox's
	// default table) and shows none if there is none.
	Outbox outbox.Inspector
	// RetryNowFunc, if set, wakes the process's outbox dispatcher after an
	// operator freed a message (idem serve --events).
	RetryNowFunc func()
	// ReconcileFunc, if set, resumes the suspended operation of a record
	// now (idem serve --provider); nil hides the action.
	ReconcileFunc func(ctx context.Context, scope, key string) error
	// DeriveKeyFunc, if set, returns the downstream key of a record's
	// step (idem.DeriveKeyWith with the deployment's secret, which only
	// idem serve knows); nil shows that the keys are not known here.
	DeriveKeyFunc func(scope, key, step string) string
	// StepNames, if set, are the steps the operations run, in order, so
	// that steps not reached yet show as pending.
	StepNames []string
	// Rates, if set, is the process's outcome history (serve, proxy).
	Rates func(now time.Time) []metrics.RateSample
	// Encryption opens sealed responses and recovery points. Nil: they
	// are shown as encrypted.
	Encryption *idemcrypt.Encryption
	// ShowBody shows stored bodies and step data (they may hold personal
	// data). Defaults to false.
	ShowBody bool
	// Token, if set, is required on every page (see LoadToken).
	Token string
	// TTL is the retention records are written with, to show when a
	// record was claimed (its expiry minus TTL) and to filter by age.
	// Defaults to idem.DefaultTTL.
	TTL time.Duration
	// Title names the process in the pages ("idem serve"). Defaults to
	// "idem console".
	Title string
	// Logger receives the audit log and errors. Defaults to slog.Default.
	Logger *slog.Logger
	// NowFunc is the clock. Defaults to time.Now.
	NowFunc func() time.Time
}

// Console serves the pages. Close it to stop its background count.
type Console struct {
	cfg    Config
	src    Source
	ob     outbox.Inspector
	info   SourceInfo
	refs   *refs
	key    []byte // signs sessions, CSRF and confirmation tokens
	token  string
	pages  map[string]*template.Template
	logins *rate.Limiter

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	// acting holds the ids of the records an action runs on, so that
	// a second action on one record (another tab, a double click) is
	// refused at once instead of racing the first. Entries live only
	// while their request runs.
	acting struct {
		sync.Mutex
		ids map[string]struct{}
	}

	total struct {
		sync.Mutex
		n       int64
		exact   bool
		at      time.Time
		running chan struct{} // closed when the running count ends; nil: none
	}
}

// totalMaxAge is how long a counted total is shown before it is counted
// again (in the background).
const totalMaxAge = 30 * time.Second

// New returns a console over cfg.Store.
func New(ctx context.Context, cfg Config) (*Console, error) {
	if cfg.Store == nil || cfg.Store.Records == nil {
		return nil, errors.New("console: no store")
	}
	if cfg.TTL <= 0 {
		cfg.TTL = idem.DefaultTTL
	}
	if cfg.Title == "" {
		cfg.Title = "idem console"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.NowFunc == nil {
		cfg.NowFunc = time.Now
	}
	src, err := sourceOf(cfg.Store)
	if err != nil {
		return nil, err
	}
	c := &Console{cfg: cfg, src: src, info: src.Describe(), refs: newRefs(), token: cfg.Token,
		key: make([]byte, 32), logins: rate.NewLimiter(rate.Every(6*time.Second), 10)}
	if _, err := rand.Read(c.key); err != nil {
		return nil, err
	}
	if c.ob = cfg.Outbox; c.ob == nil {
		if c.ob, err = findOutbox(ctx, cfg.Store, cfg.Spec); err != nil {
			return nil, fmt.Errorf("console: looking for an outbox: %w", err)
		}
	}
	if c.pages, err = parseTemplates(); err != nil {
		return nil, err
	}
	c.ctx, c.cancel = context.WithCancel(context.WithoutCancel(ctx))
	return c, nil
}

// Close stops the background count and waits for it.
func (c *Console) Close() {
	c.cancel()
	c.wg.Wait()
}

// sourceOf returns the Source of an opened store.
func sourceOf(s *backend.Store) (Source, error) {
	switch {
	case s.SQLite != nil:
		return newSQLiteSource(s.SQLite), nil
	case s.PG != nil:
		ps, ok := s.Records.(*pgstore.Store)
		if !ok {
			return nil, fmt.Errorf("console: unexpected PostgreSQL store %T", s.Records)
		}
		return newPGSource(ps, s.PG), nil
	}
	in, ok := s.Records.(idemstore.Inspector)
	if !ok {
		return nil, fmt.Errorf("console: %s cannot be inspected", s.Where)
	}
	kind := map[backend.Kind]string{backend.Redis: "Redis", backend.RedisCluster: "Redis Cluster", backend.Memory: "memory"}[s.Kind]
	if kind == "" {
		kind = string(s.Kind)
	}
	return newInspectorSource(in, kind), nil
}

// findOutbox returns the outbox in the store's database, or nil.
func findOutbox(ctx context.Context, s *backend.Store, spec string) (outbox.Inspector, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	switch {
	case s.SQLite != nil:
		ob, err := sqliteoutbox.New(s.SQLite.DB(), nil)
		if err != nil {
			return nil, err
		}
		if ok, err := ob.Exists(ctx); err != nil || !ok {
			return nil, err
		}
		return ob, nil
	case s.PG != nil:
		cfg := &pgoutbox.Config{}
		if u, err := url.Parse(spec); err == nil {
			cfg.Schema = u.Query().Get("idem_schema")
		}
		ob, err := pgoutbox.New(s.PG, cfg)
		if err != nil {
			return nil, err
		}
		if ok, err := ob.Exists(ctx); err != nil || !ok {
			return nil, err
		}
		return ob, nil
	case s.MySQL != nil:
		ob, err := mysqloutbox.New(s.MySQL, nil)
		if err != nil {
			return nil, err
		}
		if ok, err := ob.Exists(ctx); err != nil || !ok {
			return nil, err
		}
		return ob, nil
	}
	return nil, nil
}

// Handler returns the console's HTTP handler.
func (c *Console) Handler() http.Handler {
	mux := http.NewServeMux()
	static, _ := fs.Sub(staticFiles, "static")
	mux.Handle("GET /static/", http.StripPrefix("/static/", staticHandler(http.FileServerFS(static))))
	mux.HandleFunc("GET /login", c.loginPage)
	mux.HandleFunc("POST /login", c.login)
	mux.Handle("POST /logout", c.authed(c.logout))
	mux.Handle("GET /{$}", c.authed(c.overview))
	mux.Handle("GET /rates.svg", c.authed(c.ratesSVG))
	mux.Handle("GET /records", c.authed(c.records))
	mux.Handle("POST /search", c.authed(c.search))
	mux.Handle("GET /records/{id}", c.authed(c.record))
	mux.Handle("GET /records/{id}/{action}", c.authed(c.confirmRecord))
	mux.Handle("POST /records/{id}/{action}", c.authed(c.actRecord))
	mux.Handle("GET /outbox", c.authed(c.outboxPage))
	mux.Handle("GET /outbox/{seq}/retry", c.authed(c.confirmRetry))
	mux.Handle("POST /outbox/{seq}/retry", c.authed(c.retry))
	return c.guard(mux)
}

// maxForm bounds a POST body.
const maxForm = 16 << 10

// guard sets the security headers of every response, refuses requests to
// a host that is not loopback when the console has no token (DNS
// rebinding), and bounds request bodies.
func (c *Console) guard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "+
			"connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
		h.Set("X-Frame-Options", "DENY")
		h.Set("X-Content-Type-Options", "nosniff")
		// Same-origin referrers only (the console's URLs hold no keys): with
		// no-referrer, browsers send "Origin: null" on form posts.
		h.Set("Referrer-Policy", "same-origin")
		h.Set("Cross-Origin-Opener-Policy", "same-origin")
		h.Set("Cross-Origin-Resource-Policy", "same-origin")
		if c.token == "" && !loopbackHost(r) {
			http.Error(w, "This console has no token and answers only at a loopback address (127.0.0.1, [::1], localhost).", http.StatusMisdirectedRequest)
			return
		}
		if r.Body != nil {
			r.Body = http.MaxBytesReader(w, r.Body, maxForm)
		}
		next.ServeHTTP(w, r)
	})
}

// staticHandler serves the embedded assets, cacheable for an hour.
func staticHandler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.RawQuery != "" {
			http.Error(w, "unexpected query", http.StatusBadRequest)
			return
		}
		w.Header().Set("Cache-Control", "public, max-age=3600")
		next.ServeHTTP(w, r)
	})
}

// handlerFunc is a page handler with the request's session.
type handlerFunc func(w http.ResponseWriter, r *http.Request, s session)

// authed runs h for an authenticated session: with a token, a valid
// session cookie or the bearer token; without one, the session cookie,
// issued on the first page a browser opens. Other requests get 401 and
// the login form; a wrong bearer token is logged.
func (c *Console) authed(h handlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		now := c.cfg.NowFunc()
		if c.token != "" {
			if ok, present := c.bearerOK(r); present {
				if !ok {
					c.cfg.Logger.Warn("console: a request with a wrong bearer token was refused", "remote", r.RemoteAddr, "path", r.URL.Path)
					w.Header().Set("WWW-Authenticate", `Bearer realm="idem console", error="invalid_token"`)
					c.render(w, r, http.StatusUnauthorized, "login", session{}, map[string]any{"Error": "Wrong token.", "Next": "/"})
					return
				}
				h(w, r, session{id: "bearer0000000000000000000000000", bearer: true})
				return
			}
		}
		s, ok := c.sessionOf(r, now)
		if !ok {
			if c.token != "" {
				w.Header().Set("WWW-Authenticate", `Bearer realm="idem console"`)
				next := "/"
				if r.Method == http.MethodGet {
					next = r.URL.RequestURI()
				}
				c.render(w, r, http.StatusUnauthorized, "login", session{}, map[string]any{"Next": next})
				return
			}
			if r.Method != http.MethodGet {
				c.fail(w, r, session{}, http.StatusForbidden, errors.New("no session: open the console's pages first"))
				return
			}
			var ck *http.Cookie
			ck, s = c.newSessionCookie(now)
			http.SetCookie(w, ck)
		}
		if r.Method == http.MethodPost {
			if err := r.ParseForm(); err != nil {
				c.fail(w, r, s, http.StatusBadRequest, fmt.Errorf("unreadable form: %w", err))
				return
			}
			if err := c.checkCSRF(r, s); err != nil {
				c.cfg.Logger.Warn("console: a POST was refused", "remote", r.RemoteAddr, "path", r.URL.Path, "reason", err.Error())
				c.fail(w, r, s, http.StatusForbidden, err)
				return
			}
		}
		h(w, r, s)
	})
}

func (c *Console) loginPage(w http.ResponseWriter, r *http.Request) {
	if c.token == "" {
		http.Redirect(w, r, "/", http.StatusSeeOther)
		return
	}
	next := r.URL.Query().Get("next")
	if !localPath(next) {
		next = "/"
	}
	c.render(w, r, http.StatusOK, "login", session{}, map[string]any{"Next": next})
}

// login checks the token typed into the form and sets the session cookie.
// Attempts are rate-limited (10 at once, then one per 6 seconds): a
// token of MinTokenLength characters is out of reach anyway, but the log
// stays readable.
func (c *Console) login(w http.ResponseWriter, r *http.Request) {
	if c.token == "" {
		http.Redirect(w, r, "/", http.StatusSeeOther)
		return
	}
	if err := r.ParseForm(); err != nil {
		c.render(w, r, http.StatusBadRequest, "login", session{}, map[string]any{"Error": "Unreadable form.", "Next": "/"})
		return
	}
	next := r.PostFormValue("next")
	if !localPath(next) {
		next = "/"
	}
	if err := sameOrigin(r); err != nil {
		c.render(w, r, http.StatusForbidden, "login", session{}, map[string]any{"Error": err.Error(), "Next": next})
		return
	}
	if !c.logins.Allow() {
		c.render(w, r, http.StatusTooManyRequests, "login", session{}, map[string]any{"Error": "Too many attempts; wait a minute.", "Next": next})
		return
	}
	if !c.tokenMatches(r.PostFormValue("token")) {
		c.cfg.Logger.Warn("console: a login with a wrong token was refused", "remote", r.RemoteAddr)
		c.render(w, r, http.StatusUnauthorized, "login", session{}, map[string]any{"Error": "Wrong token.", "Next": next})
		return
	}
	ck, s := c.newSessionCookie(c.cfg.NowFunc())
	http.SetCookie(w, ck)
	c.cfg.Logger.Info("console: login", "who", s.who(r, true))
	http.Redirect(w, r, next, http.StatusSeeOther)
}

func (c *Console) logout(w http.ResponseWriter, r *http.Request, s session) {
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: "", Path: "/", MaxAge: -1, HttpOnly: true, SameSite: http.SameSiteStrictMode})
	if c.token == "" {
		http.Redirect(w, r, "/", http.StatusSeeOther)
		return
	}
	http.Redirect(w, r, "/login", http.StatusSeeOther)
}

// localPath reports whether p is a path on this server ("/x", never
// "//host" or "/\host", which browsers read as another host).
func localPath(p string) bool {
	return len(p) > 0 && len(p) < 2048 && p[0] == '/' && (len(p) == 1 || p[1] != '/' && p[1] != '\\')
}

func randomID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

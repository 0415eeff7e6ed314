// Package provider is the card-provider simulator behind `idem provider`: a
// small charges API with injected faults, itself made retry-safe with idem
// on SQLite, for exercising a caller's exactly-once path (see `idem serve
// --provider`).
//
// POST /v1/charges needs an Idempotency-Key; a retry with the same key
// replays the first answer, so a caller that retries with one key is
// charged once. Faults, drawn per POST:
//
//   - FailRate: 503 before anything happens (the key is not even claimed);
//   - DropRate: the charge is committed (with its stored response), then
//     the connection is closed without an answer: the lost response a
//     caller must resolve by retrying with the same key;
//   - DeclineRate: the charge is declined (402 card_declined) instead of
//     made; the decline is stored with the key like any answer, so a retry
//     gets it again;
//   - Delay: each charge takes that long before it commits.
//
// Every injected fault is logged, with the key redacted.
package provider

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/sqlitestore"
)

// MaxBody bounds a charge request.
const MaxBody = 16 << 10

// maxListed bounds GET /v1/charges?reference=R.
const maxListed = 1000

// Charge is a charge as the API shows it.
type Charge struct {
	ID          string `json:"id"`
	AmountCents int64  `json:"amountCents"`
	Currency    string `json:"currency"`
	Reference   string `json:"reference"`
}

// Config configures a Provider.
type Config struct {
	// FailRate is the fraction of POSTs answered 503 before anything is
	// charged, in [0, 1].
	FailRate float64
	// DropRate is the fraction of POSTs whose connection is closed without
	// an answer after the charge committed, in [0, 1].
	DropRate float64
	// DeclineRate is the fraction of new charges declined with 402
	// card_declined, in [0, 1].
	DeclineRate float64
	// Delay is how long each charge takes before it commits.
	Delay time.Duration
	// Logger receives the provider's logs. Defaults to slog.Default().
	Logger *slog.Logger
}

// Provider serves the charges API on a sqlitestore file, which holds both
// the charges and the idempotency records: a charge and its stored
// response commit in one transaction.
type Provider struct {
	store *sqlitestore.Store
	cfg   Config
	mw    *idem.Middleware
}

// New returns a Provider on store, creating its charges table.
func New(ctx context.Context, store *sqlitestore.Store, cfg Config) (*Provider, error) {
	for _, r := range []float64{cfg.FailRate, cfg.DropRate, cfg.DeclineRate} {
		if !(r >= 0 && r <= 1) {
			return nil, errors.New("provider: fail, drop and decline rates must be between 0 and 1")
		}
	}
	if cfg.Delay < 0 {
		return nil, errors.New("provider: negative delay")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	_, err := store.DB().ExecContext(ctx, `
		CREATE TABLE IF NOT EXISTS charges (
			id           TEXT    PRIMARY KEY,
			amount_cents INTEGER NOT NULL,
			currency     TEXT    NOT NULL,
			reference    TEXT    NOT NULL,
			created_at   INTEGER NOT NULL
		);
		CREATE INDEX IF NOT EXISTS charges_reference ON charges (reference)`)
	if err != nil {
		return nil, fmt.Errorf("provider: migrate: %w", err)
	}
	mw, err := idem.NewMiddleware(store, &idem.Config{
		FingerprintFunc: fingerprint,
		MaxRequestBody:  MaxBody,
		Logger:          cfg.Logger,
	})
	if err != nil {
		return nil, err
	}
	return &Provider{store: store, cfg: cfg, mw: mw}, nil
}

// Handler returns the API: POST /v1/charges, GET /v1/charges/count,
// GET /v1/charges?reference=R.
func (p *Provider) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("POST /v1/charges", p.faults(p.mw.Handle(http.HandlerFunc(p.create))))
	mux.HandleFunc("GET /v1/charges/count", p.count)
	mux.HandleFunc("GET /v1/charges", p.list)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintln(w, `{"status":"ok"}`)
	})
	return mux
}

// faults injects the configured failures around the idempotent handler.
func (p *Provider) faults(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := keyAttr(r)
		if p.cfg.FailRate > 0 && mrand.Float64() < p.cfg.FailRate {
			p.cfg.Logger.LogAttrs(r.Context(), slog.LevelInfo, "injected fault: answered 503 before charging", key)
			problem(w, http.StatusServiceUnavailable, "provider.unavailable", "The provider is unavailable (injected fault)", "Nothing was charged; retry with the same Idempotency-Key.")
			return
		}
		if p.cfg.DropRate > 0 && mrand.Float64() < p.cfg.DropRate {
			// The request runs to its end (the charge and its stored
			// response commit), and the answer is lost.
			d := &discardWriter{header: http.Header{}}
			next.ServeHTTP(d, r)
			p.cfg.Logger.LogAttrs(r.Context(), slog.LevelInfo, "injected fault: dropped the answer (the connection is closed without it)",
				key, slog.Int("status", d.status), slog.String("charge", d.charge()), slog.Bool("replayed", d.header.Get(idem.HeaderReplayed) == "true"))
			if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
				_ = conn.Close()
				return
			}
			panic(http.ErrAbortHandler) // HTTP/2: reset the stream
		}
		next.ServeHTTP(w, r)
	})
}

// keyAttr is the log attribute of r's idempotency key, redacted.
func keyAttr(r *http.Request) slog.Attr {
	k, err := idem.ParseKey(r.Header.Values(idem.HeaderKey))
	if err != nil {
		return slog.String("key", "(invalid)")
	}
	return slog.String("key", idem.RedactKey(k))
}

// discardWriter is a ResponseWriter that sends nothing: it keeps the
// status and the start of the body, for the log line of the dropped answer.
type discardWriter struct {
	header http.Header
	status int
	body   []byte
}

func (d *discardWriter) Header() http.Header { return d.header }

func (d *discardWriter) Write(b []byte) (int, error) {
	if d.status == 0 {
		d.status = http.StatusOK
	}
	d.body = append(d.body, b[:min(len(b), 4<<10-len(d.body))]...)
	return len(b), nil
}

func (d *discardWriter) WriteHeader(status int) {
	if d.status == 0 {
		d.status = status
	}
}

// charge returns the id of the charge the dropped answer held, if any.
func (d *discardWriter) charge() string {
	var c Charge
	if d.status != http.StatusCreated || json.Unmarshal(d.body, &c) != nil {
		return ""
	}
	return c.ID
}

// request is a validated charge request: what is fingerprinted.
type request struct {
	AmountCents int64  `json:"amountCents"`
	Currency    string `json:"currency"`
	Reference   string `json:"reference"`
}

// validate parses a charge request, or returns a 400 problem.
func validate(body []byte) (request, *idem.Problem) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(body, &fields); err != nil || fields == nil {
		return request{}, invalid("the body must be a JSON object")
	}
	var req request
	var errs []string
	for name := range fields {
		if name != "amountCents" && name != "currency" && name != "reference" {
			errs = append(errs, name+" is not a field of a charge")
		}
	}
	if err := json.Unmarshal(fields["amountCents"], &req.AmountCents); err != nil || req.AmountCents <= 0 || req.AmountCents > 1e15 {
		errs = append(errs, "amountCents must be a whole number of cents between 1 and 1000000000000000")
	}
	if err := json.Unmarshal(fields["currency"], &req.Currency); err != nil || len(req.Currency) != 3 ||
		strings.Trim(req.Currency, "ABCDEFGHIJKLMNOPQRSTUVWXYZ") != "" {
		errs = append(errs, "currency must be a 3-letter upper-case code such as USD")
	}
	if err := json.Unmarshal(fields["reference"], &req.Reference); err != nil || req.Reference == "" ||
		utf8.RuneCountInString(req.Reference) > 100 {
		errs = append(errs, "reference must be a string of 1 to 100 characters")
	}
	if len(errs) > 0 {
		return request{}, invalid(strings.Join(errs, "; "))
	}
	return req, nil
}

func invalid(detail string) *idem.Problem {
	return &idem.Problem{Status: http.StatusBadRequest, Code: "charge.invalid", Title: "The charge request is invalid", Detail: detail}
}

// fingerprint is the middleware's FingerprintFunc: the validated request.
func fingerprint(_ *http.Request, body []byte) ([]byte, error) {
	req, p := validate(body)
	if p != nil {
		return nil, p
	}
	return json.Marshal(req)
}

// create handles POST /v1/charges behind the idem middleware: the charge is
// written through the execution's transaction, which commits it with the
// stored response.
func (p *Provider) create(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	info, ok := idem.InfoFromContext(ctx)
	if !ok {
		problem(w, http.StatusInternalServerError, "provider.internal", "Internal error", "")
		return
	}
	var req request
	if err := json.Unmarshal(info.Payload, &req); err != nil {
		problem(w, http.StatusInternalServerError, "provider.internal", "Internal error", "")
		return
	}
	if p.cfg.Delay > 0 {
		t := time.NewTimer(p.cfg.Delay)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			problem(w, http.StatusServiceUnavailable, "provider.cancelled", "The charge was cancelled", "")
			return
		}
	}
	if p.cfg.DeclineRate > 0 && mrand.Float64() < p.cfg.DeclineRate {
		// A decline is an answer like a charge: stored with the key, so
		// that a retry gets it again.
		p.cfg.Logger.LogAttrs(ctx, slog.LevelInfo, "injected fault: declined the charge (402 card_declined)",
			slog.String("key", idem.RedactKey(info.Key)), slog.String("reference", req.Reference))
		problem(w, http.StatusPaymentRequired, "card_declined", "The card was declined",
			"The card issuer declined the charge (injected fault).")
		return
	}
	tx, err := sqlitestore.Tx(ctx)
	if err != nil {
		problem(w, http.StatusServiceUnavailable, "provider.unavailable", "The provider is unavailable", "")
		return
	}
	c := Charge{ID: "ch_" + strings.ToLower(rand.Text()), AmountCents: req.AmountCents, Currency: req.Currency, Reference: req.Reference}
	if _, err := tx.ExecContext(ctx, `INSERT INTO charges (id, amount_cents, currency, reference, created_at) VALUES (?, ?, ?, ?, ?)`,
		c.ID, c.AmountCents, c.Currency, c.Reference, time.Now().UnixNano()); err != nil {
		problem(w, http.StatusServiceUnavailable, "provider.unavailable", "The provider is unavailable", "")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/v1/charges/"+c.ID)
	w.WriteHeader(http.StatusCreated)
	_ = json.NewEncoder(w).Encode(c)
}

// count handles GET /v1/charges/count.
func (p *Provider) count(w http.ResponseWriter, r *http.Request) {
	var n int64
	if err := p.store.ReadDB().QueryRowContext(r.Context(), `SELECT COUNT(*) FROM charges`).Scan(&n); err != nil {
		problem(w, http.StatusServiceUnavailable, "provider.unavailable", "The provider is unavailable", "")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, "{\"count\":%d}\n", n)
}

// list handles GET /v1/charges?reference=R: the charges with that
// reference, oldest first, at most 1000.
func (p *Provider) list(w http.ResponseWriter, r *http.Request) {
	ref := r.URL.Query().Get("reference")
	if ref == "" {
		problem(w, http.StatusBadRequest, "charge.reference_required", "A reference is required", "Use GET /v1/charges?reference=R.")
		return
	}
	rows, err := p.store.ReadDB().QueryContext(r.Context(),
		`SELECT id, amount_cents, currency, reference FROM charges WHERE reference = ? ORDER BY created_at LIMIT `+strconv.Itoa(maxListed), ref)
	if err != nil {
		problem(w, http.StatusServiceUnavailable, "provider.unavailable", "The provider is unavailable", "")
		return
	}
	defer rows.Close()
	charges := []Charge{}
	for rows.Next() {
		var c Charge
		if err := rows.Scan(&c.ID, &c.AmountCents, &c.Currency, &c.Reference); err != nil {
			problem(w, http.StatusServiceUnavailable, "provider.unavailable", "The provider is unavailable", "")
			return
		}
		charges = append(charges, c)
	}
	if err := rows.Err(); err != nil && !errors.Is(err, sql.ErrNoRows) {
		problem(w, http.StatusServiceUnavailable, "provider.unavailable", "The provider is unavailable", "")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"charges": charges})
}

func problem(w http.ResponseWriter, status int, code, title, detail string) {
	idem.WriteProblem(w, &idem.Problem{Status: status, Code: code, Title: title, Detail: detail})
}

// Package datalayer is what the data-layer examples share: the databases
// they run on (Backend), the orders table, and the HTTP handler around each
// library's one write. A library example supplies a Library: how to open
// the library on a database, and the function that writes an order through
// it inside the execution's *sql.Tx. The order and the idempotency record
// then commit together or not at all.
package datalayer

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemstore"
)

// Order is one order, as the handler receives and answers it.
type Order struct {
	ID       int64  `json:"id"`
	Item     string `json:"item"`
	Quantity int    `json:"quantity"`
}

// Create writes o through a library inside tx, the execution's
// transaction, and sets o.ID.
type Create func(ctx context.Context, tx *sql.Tx, o *Order) error

// A Library is one data layer's side of an example.
type Library struct {
	// Name names the library ("gorm", "sqlx" ...).
	Name string
	// Open prepares the library on an open database (choosing its dialect
	// by db.Backend.Name) and returns its Create.
	Open func(db *DB) (Create, error)
}

// DB is an open backend: idem's store and the application's pool on one
// database.
type DB struct {
	// Backend is the backend it was opened by.
	Backend *Backend
	// Store is idem's store; it implements idemstore.TxClaimer and
	// idemstore.Inspector.
	Store idemstore.Store
	// SQL is the application's pool on the same database. Libraries are
	// opened on it; their writes in a request go through the execution's
	// transaction instead.
	SQL *sql.DB
	// Tx returns the transaction of the idempotent execution ctx belongs
	// to (sqlitestore.Tx, ...).
	Tx func(ctx context.Context) (*sql.Tx, error)

	close func() error
}

// Close closes the store and the pool.
func (db *DB) Close() error { return db.close() }

// Backend is one database the examples run on.
type Backend struct {
	// Name is "sqlite", "postgres" or "mysql".
	Name string
	// Prefix is how a -db URL for this backend starts ("sqlite:",
	// "postgres://").
	Prefix string

	parse func(url string) (dsn string, err error) // a -db value to Open's DSN

	open func(ctx context.Context, dsn string) (*DB, error)
}

// Open opens the store and the pool on the database dsn names (as Parse
// returns it), migrates the store and creates the orders table.
func (b *Backend) Open(ctx context.Context, dsn string) (*DB, error) {
	db, err := b.open(ctx, dsn)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", b.Name, err)
	}
	db.Backend = b
	return db, nil
}

// Backends are the backends the examples run on.
var Backends = []*Backend{SQLite, Postgres, MySQL}

// ByName returns the backend called name, or nil.
func ByName(name string) *Backend {
	for _, b := range Backends {
		if b.Name == name {
			return b
		}
	}
	return nil
}

// Parse splits a -db value into its backend and DSN. A value with no known
// prefix is a SQLite file path.
func Parse(url string) (*Backend, string, error) {
	for _, b := range Backends {
		if !strings.HasPrefix(url, b.Prefix) {
			continue
		}
		dsn, err := b.parse(url)
		if err != nil {
			return nil, "", fmt.Errorf("%s: %w", b.Name, err)
		}
		return b, dsn, nil
	}
	if strings.Contains(url, "://") {
		names := []string{}
		for _, b := range Backends {
			names = append(names, b.Prefix+"...")
		}
		return nil, "", fmt.Errorf("unsupported database %q: use %s or a SQLite file path", url, strings.Join(names, ", "))
	}
	return SQLite, url, nil
}

// Handler serves POST /orders: idem's middleware (built from cfg) around a
// handler that decodes the order, writes it with create in the execution's
// transaction and answers 201 with the order.
func Handler(db *DB, cfg *idem.Config, create Create) (http.Handler, error) {
	mw, err := idem.NewMiddleware(db.Store, cfg)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("POST /orders", mw.Handle(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		o, err := parse(r.Body)
		if err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
			return
		}
		tx, err := db.Tx(r.Context())
		if err != nil {
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": "no transaction"})
			return
		}
		if err := create(r.Context(), tx, &o); err != nil {
			writeJSON(w, http.StatusInternalServerError, map[string]string{"error": "could not create the order"})
			return
		}
		writeJSON(w, http.StatusCreated, o)
	})))
	return mux, nil
}

var errInvalid = errors.New(`send {"item": "...", "quantity": N} with a non-empty item and a positive quantity`)

func parse(body io.Reader) (Order, error) {
	var o Order
	dec := json.NewDecoder(body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&o); err != nil || o.ID != 0 || strings.TrimSpace(o.Item) == "" || o.Quantity <= 0 {
		return Order{}, errInvalid
	}
	return o, nil
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// createTable runs the orders table's DDL on db.
func createTable(ctx context.Context, db *sql.DB, ddl string) error {
	if _, err := db.ExecContext(ctx, ddl); err != nil {
		return fmt.Errorf("create the orders table: %w", err)
	}
	return nil
}

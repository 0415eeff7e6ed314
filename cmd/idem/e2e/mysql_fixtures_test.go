package e2e

import (
	"context"
	"database/sql"
	"net/url"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
)

// defaultMySQLURL is the MariaDB server's DSN (go-sql-driver's form) unless
// IDEM_TEST_MYSQL_URL names another.
const defaultMySQLURL = "root@tcp(127.0.0.1:3306)/test"

// sqlDatabase is a fresh database of one test that several `idem serve`
// share (PostgreSQL or MariaDB), with the test's own connections.
type sqlDatabase interface {
	// dbURL is the database as --db names it.
	dbURL() string
	// count returns the number of payment rows.
	count(t *testing.T) int64
	// paymentIDs returns the ids of the payment rows, in order.
	paymentIDs(t *testing.T) []string
	// recordCount returns the number of idempotency records in the
	// default records table.
	recordCount(t *testing.T) int64
	// outboxRows returns the outbox's rows and its unsent ones.
	outboxRows(t *testing.T) (rows, unsent int64)
}

func (db *pgDatabase) dbURL() string { return db.url }

func (db *pgDatabase) outboxRows(t *testing.T) (rows, unsent int64) {
	t.Helper()
	if err := db.pool.QueryRow(testContext(t), `SELECT COUNT(*), COUNT(*) FILTER (WHERE sent_at IS NULL) FROM idem.outbox`).Scan(&rows, &unsent); err != nil {
		t.Fatalf("count the outbox in %s: %v", db.name, err)
	}
	return rows, unsent
}

// myDatabase is a fresh MariaDB database of one test.
type myDatabase struct {
	name string
	url  string  // for --db
	db   *sql.DB // the test's own connections
}

// newMyDatabase creates a database named idem_e2e_<random> on the server
// of IDEM_TEST_MYSQL_URL and drops it when the test ends.
func newMyDatabase(t *testing.T) *myDatabase {
	t.Helper()
	cfg, err := mysql.ParseDSN(envOr("IDEM_TEST_MYSQL_URL", defaultMySQLURL))
	if err != nil {
		t.Fatalf("IDEM_TEST_MYSQL_URL: %v", err)
	}
	requireReachable(t, "MariaDB", "tcp", cfg.Addr)
	cfg.Timeout = 5 * time.Second
	admin, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Close() })
	name := "idem_e2e_" + randomName(6)
	if _, err := admin.ExecContext(testContext(t), "CREATE DATABASE "+name); err != nil {
		t.Fatalf("create database %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
		defer cancel()
		if _, err := admin.ExecContext(ctx, "DROP DATABASE IF EXISTS "+name); err != nil {
			t.Errorf("drop database %s: %v", name, err)
		}
	})
	own := *cfg
	own.DBName = name
	own.ParseTime = true
	d := &myDatabase{name: name}
	if d.db, err = sql.Open("mysql", own.FormatDSN()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.db.Close() })
	u := url.URL{Scheme: "mysql", User: url.User(cfg.User), Host: cfg.Addr, Path: "/" + name}
	if cfg.Passwd != "" {
		u.User = url.UserPassword(cfg.User, cfg.Passwd)
	}
	d.url = u.String()
	return d
}

func (d *myDatabase) dbURL() string { return d.url }

func (d *myDatabase) scalar(t *testing.T, q string) int64 {
	t.Helper()
	var n int64
	if err := d.db.QueryRowContext(testContext(t), q).Scan(&n); err != nil {
		t.Fatalf("%s in %s: %v", q, d.name, err)
	}
	return n
}

func (d *myDatabase) count(t *testing.T) int64 { return d.scalar(t, "SELECT COUNT(*) FROM payments") }

func (d *myDatabase) recordCount(t *testing.T) int64 {
	return d.scalar(t, "SELECT COUNT(*) FROM idem_records")
}

func (d *myDatabase) outboxRows(t *testing.T) (rows, unsent int64) {
	return d.scalar(t, "SELECT COUNT(*) FROM idem_outbox"), d.scalar(t, "SELECT COUNT(*) FROM idem_outbox WHERE sent_at IS NULL")
}

func (d *myDatabase) paymentIDs(t *testing.T) []string {
	t.Helper()
	rows, err := d.db.QueryContext(testContext(t), "SELECT id FROM payments ORDER BY id")
	if err != nil {
		t.Fatalf("list payments in %s: %v", d.name, err)
	}
	defer rows.Close()
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return ids
}

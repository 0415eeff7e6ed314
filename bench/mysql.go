package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
)

// defaultMySQLURL is the MariaDB server (a go-sql-driver DSN) unless
// IDEM_TEST_MYSQL_URL names another.
const defaultMySQLURL = "root@tcp(127.0.0.1:3306)/test"

// myDatabase creates a fresh MariaDB database on the server of
// o.MySQLDSN and returns it as `idem serve --db` names it (mysql://). The
// returned drop function removes it.
func (e *env) myDatabase(ctx context.Context, what string) (string, func(), error) {
	cfg, err := mysql.ParseDSN(e.o.MySQLDSN)
	if err != nil {
		return "", nil, err
	}
	cfg.Timeout = 5 * time.Second
	admin, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		return "", nil, err
	}
	name := fmt.Sprintf("idem_bench_%s_%s", e.runID, what)
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
		admin.Close()
		return "", nil, fmt.Errorf("create database: %w", err)
	}
	drop := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := admin.ExecContext(ctx, "DROP DATABASE IF EXISTS "+name); err != nil {
			e.o.logf("drop database %s: %v", name, err)
		}
		admin.Close()
	}
	u := url.URL{Scheme: "mysql", User: url.User(cfg.User), Host: cfg.Addr, Path: "/" + name}
	if cfg.Passwd != "" {
		u.User = url.UserPassword(cfg.User, cfg.Passwd)
	}
	return u.String(), drop, nil
}

// mysqlReachable reports whether the MariaDB server answers.
func mysqlReachable(ctx context.Context, dsn string) error {
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	return db.PingContext(ctx)
}

// openPlainMySQL opens the plain handler's pool on a mysql:// URL, sized
// as idem serve's (32 connections, idle = open, interpolateParams).
func openPlainMySQL(ctx context.Context, raw string) (*sql.DB, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, err
	}
	cfg := mysql.NewConfig()
	cfg.User = u.User.Username()
	cfg.Passwd, _ = u.User.Password()
	cfg.Net, cfg.Addr, cfg.DBName = "tcp", u.Host, strings.TrimPrefix(u.Path, "/")
	cfg.InterpolateParams, cfg.ParseTime = true, true
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, err
	}
	db := sql.OpenDB(conn)
	db.SetMaxOpenConns(32)
	db.SetMaxIdleConns(32)
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, err
	}
	if _, err := db.ExecContext(ctx, plainTableMySQL); err != nil {
		db.Close()
		return nil, err
	}
	return db, nil
}

const plainTableMySQL = `CREATE TABLE IF NOT EXISTS plain_payments (
	id           VARCHAR(64)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY,
	tenant       VARCHAR(255) NOT NULL,
	amount_cents BIGINT       NOT NULL,
	currency     VARCHAR(16)  NOT NULL,
	reference    TEXT         NOT NULL,
	created_at   DATETIME(6)  NOT NULL
) ENGINE = InnoDB`

// plainMySQL returns the plain handler's insert and read on db.
func plainMySQL(db *sql.DB) (func(context.Context, plainPayment) error, func(context.Context, string) (plainPayment, error)) {
	insert := func(ctx context.Context, p plainPayment) error {
		_, err := db.ExecContext(ctx, `INSERT INTO plain_payments (id, tenant, amount_cents, currency, reference, created_at)
			VALUES (?, ?, ?, ?, ?, ?)`, p.ID, "anonymous", p.AmountCents, p.Currency, p.Reference, p.CreatedAt.UTC())
		return err
	}
	get := func(ctx context.Context, id string) (plainPayment, error) {
		var p plainPayment
		err := db.QueryRowContext(ctx, `SELECT id, amount_cents, currency, reference, created_at FROM plain_payments WHERE id = ?`, id).
			Scan(&p.ID, &p.AmountCents, &p.Currency, &p.Reference, &p.CreatedAt)
		if errors.Is(err, sql.ErrNoRows) {
			return p, errNotFound
		}
		return p, err
	}
	return insert, get
}

// serveBackend reports whether the serve scenario runs the database
// named name: -serve-backends lists first words of the names
// ("sqlite", "postgresql", "mariadb", "redis"), case-insensitive.
func (o *options) serveBackend(name string) bool {
	if o.ServeBackends == "" {
		return true
	}
	first := serveBackendWord(name)
	for _, want := range strings.Split(o.ServeBackends, ",") {
		if strings.EqualFold(strings.TrimSpace(want), first) {
			return true
		}
	}
	return false
}

// serveBackendWord is the word -serve-backends selects a setup by: the
// first word of its name, lower case.
func serveBackendWord(name string) string {
	return strings.TrimSuffix(strings.ToLower(strings.Fields(name)[0]), ",")
}

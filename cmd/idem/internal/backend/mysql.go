package backend

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/idemhq/idem/mysqlstore"
)

// MySQLForm is the form of a MariaDB URL, for error messages.
const MySQLForm = "mysql://USER[:PASS]@HOST[:PORT]/DB (?idem_table=NAME picks the records table; driver options such as tls=true pass through)"

// Defaults a MariaDB URL may override with the driver's own options.
const (
	mysqlConnectTimeout = 5 * time.Second
	// mysqlIOTimeout bounds a read or write on a connection: it ends the
	// calls database/sql makes without a context, whatever the server
	// does.
	mysqlIOTimeout = 30 * time.Second
	// mysqlConns sizes the pool, idle connections included (database/sql
	// keeps two idle connections by default, and reconnects for most
	// requests under load).
	mysqlConns = 32
)

// ParseMySQLURL turns a mysql:// (or mariadb://) URL into the driver's
// configuration and the records table's name (idem_table, "" for the
// default). Query parameters other than idem_table are the driver's DSN
// options. Unless given, interpolateParams is on (one round trip a
// statement) and the connect, read and write timeouts are 5 s, 30 s and
// 30 s; parseTime is always on and loc is UTC, which the payments demo
// reads its times with.
func ParseMySQLURL(spec string) (*mysql.Config, string, error) {
	bad := func(why string) (*mysql.Config, string, error) {
		return nil, "", fmt.Errorf("%q is not a MariaDB URL (%s); use %s", redact(spec), why, MySQLForm)
	}
	u, err := url.Parse(spec)
	if err != nil {
		return bad("it does not parse")
	}
	if s := strings.ToLower(u.Scheme); s != "mysql" && s != "mariadb" {
		return bad("the scheme is not mysql")
	}
	if u.Opaque != "" || u.Host == "" {
		return bad("no host")
	}
	if u.User == nil || u.User.Username() == "" {
		return bad("no user")
	}
	db := strings.TrimPrefix(u.Path, "/")
	if db == "" || strings.Contains(db, "/") {
		return bad("no database, or a path with more than one part")
	}
	if u.Fragment != "" {
		return bad("a #fragment")
	}
	q := u.Query()
	table := q.Get("idem_table")
	q.Del("idem_table")
	// The driver parses its own options from a DSN's query.
	cfg, err := mysql.ParseDSN("/" + "?" + q.Encode())
	if err != nil {
		return bad(err.Error())
	}
	cfg.User = u.User.Username()
	cfg.Passwd, _ = u.User.Password()
	cfg.Net = "tcp"
	host, port := u.Hostname(), u.Port()
	if port == "" {
		port = "3306"
	}
	if host == "" || strings.ContainsAny(host, "[]") {
		return bad("no host")
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return bad("the port is not a number from 1 to 65535")
	}
	cfg.Addr = net.JoinHostPort(host, port)
	if _, _, err := net.SplitHostPort(cfg.Addr); err != nil {
		return bad("the host is not a host name or an address")
	}
	cfg.DBName = db
	if !q.Has("interpolateParams") {
		cfg.InterpolateParams = true
	}
	if !q.Has("timeout") {
		cfg.Timeout = mysqlConnectTimeout
	}
	if !q.Has("readTimeout") {
		cfg.ReadTimeout = mysqlIOTimeout
	}
	if !q.Has("writeTimeout") {
		cfg.WriteTimeout = mysqlIOTimeout
	}
	cfg.ParseTime = true
	cfg.Loc = time.UTC
	return cfg, table, nil
}

func openMySQL(ctx context.Context, spec string, o Options) (*Store, error) {
	cfg, table, err := ParseMySQLURL(spec)
	if err != nil {
		return nil, err
	}
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, fmt.Errorf("mysql: %w", err)
	}
	db := sql.OpenDB(conn)
	db.SetMaxOpenConns(mysqlConns)
	db.SetMaxIdleConns(mysqlConns)
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("mysql %s: cannot connect: %w", redact(spec), err)
	}
	s, err := mysqlstore.New(ctx, db, &mysqlstore.Config{Table: table, ReadFirst: o.ReadFirst})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("mysql %s: %w", redact(spec), err)
	}
	ping := func(ctx context.Context) error { return db.PingContext(ctx) }
	ready := func(ctx context.Context) error {
		var one int
		err := db.QueryRowContext(ctx, "SELECT 1").Scan(&one)
		if err == nil && one != 1 {
			err = errors.New("SELECT 1 did not answer 1")
		}
		return err
	}
	return &Store{Records: s, Kind: MySQL, Where: "MariaDB " + redact(spec), MySQL: db,
		Ping: ping, Ready: ready, close: db.Close}, nil
}

package datalayer

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/idemhq/idem/mysqlstore"
)

// MySQL keeps the records and the orders in one MySQL or MariaDB database
// (mysqlstore, go-sql-driver/mysql). Its -db form is
// mysql://USER[:PASS]@HOST:PORT/DB; Open takes the driver's DSN.
var MySQL = &Backend{
	Name:   "mysql",
	Prefix: "mysql://",
	parse:  mysqlDSN,
	open: func(ctx context.Context, dsn string) (*DB, error) {
		cfg, err := mysql.ParseDSN(dsn)
		if err != nil {
			return nil, err
		}
		cfg.Timeout = 5 * time.Second
		cfg.ReadTimeout, cfg.WriteTimeout = 30*time.Second, 30*time.Second
		cfg.InterpolateParams = true
		c, err := mysql.NewConnector(cfg)
		if err != nil {
			return nil, err
		}
		db := sql.OpenDB(c)
		db.SetMaxOpenConns(16)
		db.SetMaxIdleConns(16)
		store, err := mysqlstore.New(ctx, db, nil)
		if err != nil {
			db.Close()
			return nil, err
		}
		if err := createTable(ctx, db, `CREATE TABLE IF NOT EXISTS orders (
			id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
			item VARCHAR(255) NOT NULL,
			quantity BIGINT NOT NULL) ENGINE=InnoDB`); err != nil {
			db.Close()
			return nil, err
		}
		return &DB{Store: store, SQL: db, Tx: mysqlstore.Tx, close: db.Close}, nil
	},
}

// mysqlDSN turns mysql://USER[:PASS]@HOST:PORT/DB into the driver's DSN.
func mysqlDSN(s string) (string, error) {
	u, err := url.Parse(s)
	if err != nil {
		return "", fmt.Errorf("want mysql://USER[:PASS]@HOST:PORT/DB: %w", err)
	}
	db := strings.TrimPrefix(u.Path, "/")
	if u.Host == "" || db == "" || strings.Contains(db, "/") || u.User == nil || u.User.Username() == "" {
		return "", fmt.Errorf("want mysql://USER[:PASS]@HOST:PORT/DB, got %q", s)
	}
	cfg := mysql.NewConfig()
	cfg.User = u.User.Username()
	cfg.Passwd, _ = u.User.Password()
	cfg.Net, cfg.Addr, cfg.DBName = "tcp", u.Host, db
	return cfg.FormatDSN(), nil
}

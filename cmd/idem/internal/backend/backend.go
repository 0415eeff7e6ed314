// Package backend opens the stores `idem serve`, `idem proxy` and
// `idem cleanup` run on, from the --db and --store flags.
package backend

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/idemhq/idem/idemstore"
	"github.com/idemhq/idem/memstore"
	"github.com/idemhq/idem/pgstore"
	"github.com/idemhq/idem/redisstore"
	"github.com/idemhq/idem/sqlitestore"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// Kind names a store backend.
type Kind string

// The backends.
const (
	SQLite   Kind = "sqlite"
	Postgres Kind = "postgres"
	Redis    Kind = "redis"
	Memory   Kind = "memory"
	MySQL    Kind = "mysql"
)

// Supported describes the forms a --db or --store value may take, for
// error messages.
const Supported = "a SQLite file path, postgres://… or postgresql://… (?idem_schema=NAME), " +
	"mysql://USER[:PASS]@HOST[:PORT]/DB (?idem_table=NAME), " +
	"redis://… or rediss://… (?prefix=TEXT), redis+cluster://host:port,host:port… (a Redis Cluster), or memory"

// KindOf classifies a --db or --store value: a postgres:// or
// postgresql:// URL (its query parameter idem_schema=NAME chooses the
// records' schema, default "idem"), a redis:// or rediss:// URL (its query
// parameter prefix=TEXT starts every key, default "idem:"), a
// redis+cluster:// or rediss+cluster:// URL (a Redis Cluster, see
// openRedisCluster), "memory", or a SQLite file path. Schemes are case-insensitive. A value that starts with
// another URL scheme (letters, digits, "+", "-" or "." before a colon, at
// least two characters: "mongodb://x") or is a server address without one
// ("localhost:6379") is an error naming the supported forms, not a file
// name: a SQLite file whose name has such a colon is given as ./NAME.
func KindOf(spec string) (Kind, error) {
	if hostPort.MatchString(spec) {
		return "", fmt.Errorf("%q is a server address, not a file; give a URL: %s", spec, Supported)
	}
	scheme, ok := schemeOf(spec)
	if !ok {
		if strings.EqualFold(spec, "memory") {
			return Memory, nil
		}
		if spec == "" {
			return "", errors.New("no store given; use " + Supported)
		}
		return SQLite, nil
	}
	switch strings.ToLower(scheme) {
	case "postgres", "postgresql":
		return Postgres, nil
	case "mysql", "mariadb":
		if _, _, err := ParseMySQLURL(spec); err != nil {
			return "", err
		}
		return MySQL, nil
	case "redis", "rediss":
		return Redis, nil
	case "redis+cluster", "rediss+cluster":
		return RedisCluster, nil
	}
	return "", fmt.Errorf("%q is not a store idem knows (scheme %q); use %s", redact(spec), scheme, Supported)
}

// hostPort matches HOST:PORT ("127.0.0.1:6379", "[::1]:5432"), which is a
// server's address given without its scheme, not a file name.
var hostPort = regexp.MustCompile(`^[^/\\]+:[0-9]+$`)

// schemeOf returns the URL scheme spec starts with (RFC 3986: a letter,
// then letters, digits, "+", "-" or "."; then ":"). One letter is a
// Windows drive (C:\x.db), not a scheme.
func schemeOf(spec string) (string, bool) {
	i := strings.IndexByte(spec, ':')
	if i < 2 {
		return "", false
	}
	for j, c := range spec[:i] {
		letter := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
		if !letter && (j == 0 || !(c >= '0' && c <= '9' || c == '+' || c == '-' || c == '.')) {
			return "", false
		}
	}
	return spec[:i], true
}

// normalise lower-cases spec's scheme, which pgx and go-redis compare
// case-sensitively.
func normalise(spec string) string {
	if scheme, ok := schemeOf(spec); ok {
		return strings.ToLower(scheme) + spec[len(scheme):]
	}
	return spec
}

// Store is an opened records store and what else its backend offers.
// Records is the idemstore.Store to hand to idem (the middleware, an executor):
// Store itself deliberately is not one, because a wrapper would hide the
// optional capabilities (idemstore.TxStore, idemstore.Watcher) the store's own type
// carries.
type Store struct {
	Records idemstore.Store
	Kind    Kind
	// Where describes the location without credentials, for logs.
	Where string
	// SQLite and PG are set for those backends, so that the application
	// can keep its own tables in the same database.
	SQLite *sqlitestore.Store
	PG     *pgxpool.Pool
	// MySQL is the pool of a MariaDB store (the Records' own).
	MySQL *sql.DB
	// Ping checks the backend is reachable.
	Ping func(ctx context.Context) error
	// Ready checks that the backend answers a request, for /readyz: a
	// round trip to PostgreSQL or Redis (to every master of a Redis
	// Cluster, whose keys are all needed), a read of a SQLite file's
	// schema; memory is always ready. It returns by ctx's deadline.
	Ready func(ctx context.Context) error
	close func() error
}

// Close closes the store and its connections. It waits at most
// closeTimeout: a pool whose connections are stuck on a server that stopped
// answering (pgxpool.Close waits for every connection to be returned) must
// not keep the process from exiting.
func (s *Store) Close() error {
	if s == nil || s.close == nil {
		return nil
	}
	done := make(chan error, 1)
	go func() { done <- s.close() }()
	t := time.NewTimer(closeTimeout)
	defer t.Stop()
	select {
	case err := <-done:
		return err
	case <-t.C:
		return fmt.Errorf("%s: not closed within %v (connections still in use); abandoned", s.Where, closeTimeout)
	}
}

// closeTimeout bounds Store.Close.
const closeTimeout = 5 * time.Second

// Options tune how Open opens a store.
type Options struct {
	// AsyncClaim commits PostgreSQL claims without waiting for their WAL
	// flush (pgstore.Config.AsyncClaim). Use it only when the operations'
	// effects are written in the same database, in the execution's
	// transaction, which commits synchronously after the claim.
	AsyncClaim bool

	// ReadFirst answers PostgreSQL and MariaDB duplicates (replays, in-flight keys,
	// other payloads) with a primary-key SELECT before the claim
	// statement (pgstore.Config.ReadFirst): a replay costs one read, a
	// new key one round trip more.
	ReadFirst bool

	// OpenTimeout bounds opening the store: connecting, the first ping
	// and creating the schema. A server that accepts connections but
	// never answers makes Open fail after it instead of waiting forever.
	// Defaults to DefaultOpenTimeout.
	OpenTimeout time.Duration
}

// DefaultOpenTimeout bounds opening a store at start-up.
const DefaultOpenTimeout = 15 * time.Second

// pgConnectTimeout is pgx's connect_timeout (the TCP connection and the
// start-up exchange of one connection) unless the URL sets its own. It
// bounds every connection the pool opens, at start-up and later.
const pgConnectTimeout = 5 * time.Second

// Open opens the store named by spec with default options.
func Open(ctx context.Context, spec string) (*Store, error) {
	return OpenWith(ctx, spec, Options{})
}

// OpenWith opens the store named by spec, and checks that it answers: a
// PostgreSQL or Redis server that cannot be reached, or that does not
// answer within o.OpenTimeout, is an error (the service does not start
// half-working). Unknown schemes are errors (see KindOf).
func OpenWith(ctx context.Context, spec string, o Options) (*Store, error) {
	kind, err := KindOf(spec)
	if err != nil {
		return nil, err
	}
	if o.OpenTimeout <= 0 {
		o.OpenTimeout = DefaultOpenTimeout
	}
	start := time.Now()
	octx, cancel := context.WithTimeout(ctx, o.OpenTimeout)
	defer cancel()
	s, err := open(octx, kind, normalise(spec), o)
	var ne net.Error
	if err != nil && ctx.Err() == nil && (octx.Err() != nil || errors.As(err, &ne) && ne.Timeout()) {
		err = fmt.Errorf("%w (no answer after %v: the server accepts connections but does not answer)", err, time.Since(start).Round(100*time.Millisecond))
	}
	return s, err
}

func open(ctx context.Context, kind Kind, spec string, o Options) (*Store, error) {
	switch kind {
	case Postgres:
		// idem_schema=NAME (stripped before the URL reaches pgx) puts the
		// records in another schema than "idem".
		conn, schema, err := cutQuery(spec, "idem_schema")
		if err != nil {
			return nil, fmt.Errorf("postgres: %w", err)
		}
		cfg, err := pgxpool.ParseConfig(conn)
		if err != nil {
			return nil, fmt.Errorf("postgres: %w", err)
		}
		if !mustQuery(conn).Has("connect_timeout") {
			cfg.ConnConfig.ConnectTimeout = pgConnectTimeout
		}
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			return nil, fmt.Errorf("postgres: %w", err)
		}
		if err := pool.Ping(ctx); err != nil {
			pool.Close()
			return nil, fmt.Errorf("postgres %s: cannot connect: %w", redact(spec), err)
		}
		s, err := pgstore.New(ctx, pool, &pgstore.Config{Schema: schema, AsyncClaim: o.AsyncClaim, ReadFirst: o.ReadFirst})
		if err != nil {
			pool.Close()
			return nil, fmt.Errorf("postgres %s: %w", redact(spec), err)
		}
		ping := func(ctx context.Context) error { return pool.Ping(ctx) }
		return &Store{Records: s, Kind: Postgres, Where: "PostgreSQL " + redact(spec), PG: pool,
			Ping: ping, Ready: ping,
			close: func() error { pool.Close(); return nil }}, nil
	case Redis:
		// prefix=TEXT (stripped before the URL reaches go-redis) starts
		// every key with TEXT instead of "idem:".
		conn, prefix, err := cutQuery(spec, "prefix")
		if err != nil {
			return nil, fmt.Errorf("redis: %w", err)
		}
		opts, err := redis.ParseURL(conn)
		if err != nil {
			return nil, fmt.Errorf("redis: %w", err)
		}
		// An unresponsive Redis must turn into a prompt 503, not a wait of
		// go-redis's default 5 s per request: 1 s unless the URL says
		// otherwise (dial_timeout, read_timeout, write_timeout).
		q := mustQuery(conn)
		if !q.Has("dial_timeout") {
			opts.DialTimeout = redisTimeout
		}
		if !q.Has("read_timeout") {
			opts.ReadTimeout = redisTimeout
		}
		if !q.Has("write_timeout") {
			opts.WriteTimeout = redisTimeout
		}
		opts.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled} // as in cluster.go
		// Deadlines through the context, no socket health check before
		// every command (redisstore's README, "Client options").
		redisstore.RecommendOptions(opts)
		client := redis.NewClient(opts)
		// Like PostgreSQL, Redis must answer at start: a typo in the URL
		// fails at once instead of as 503s later. Once started, a Redis
		// that goes away answers 503 and recovers by itself.
		if err := client.Ping(ctx).Err(); err != nil {
			client.Close()
			return nil, fmt.Errorf("redis %s: cannot connect: %w", redact(spec), err)
		}
		s, err := redisstore.New(client, &redisstore.Config{Prefix: prefix})
		if err != nil {
			client.Close()
			return nil, fmt.Errorf("redis: %w", err)
		}
		ping := func(ctx context.Context) error { return client.Ping(ctx).Err() }
		return &Store{Records: s, Kind: Redis, Where: "Redis " + redact(spec),
			Ping: ping, Ready: ping,
			close: client.Close}, nil
	case RedisCluster:
		return openRedisCluster(ctx, spec)
	case MySQL:
		return openMySQL(ctx, spec, o)
	case Memory:
		s, err := memstore.New(nil)
		if err != nil {
			return nil, err
		}
		ok := func(context.Context) error { return nil }
		return &Store{Records: s, Kind: Memory, Where: "memory (this process only)", Ping: ok, Ready: ok}, nil
	}
	abs, err := filepath.Abs(spec)
	if err != nil {
		return nil, err
	}
	s, err := sqlitestore.Open(ctx, abs, nil)
	if err != nil {
		return nil, err
	}
	return &Store{Records: s, Kind: SQLite, Where: "SQLite file " + abs, SQLite: s,
		Ping:  func(ctx context.Context) error { return s.ReadDB().PingContext(ctx) },
		Ready: SQLiteReady(s),
		close: s.Close}, nil
}

// SQLiteReady returns a readiness check of a SQLite store: a read of the
// file's schema through a reader connection, which a ping (a pooled
// connection, no file access) is not.
func SQLiteReady(s *sqlitestore.Store) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		var n int
		return s.ReadDB().QueryRowContext(ctx, `SELECT count(*) FROM sqlite_schema`).Scan(&n)
	}
}

// redisTimeout bounds each Redis dial, read and write unless the URL sets
// its own.
const redisTimeout = time.Second

func mustQuery(spec string) url.Values {
	u, err := url.Parse(spec)
	if err != nil {
		return url.Values{}
	}
	return u.Query()
}

// cutQuery removes the query parameter name from a URL and returns the URL
// without it and the parameter's value ("" if absent).
func cutQuery(spec, name string) (string, string, error) {
	u, err := url.Parse(spec)
	if err != nil {
		return "", "", err
	}
	q := u.Query()
	v := q.Get(name)
	if !q.Has(name) {
		return spec, "", nil
	}
	q.Del(name)
	u.RawQuery = q.Encode()
	return u.String(), v, nil
}

// redact removes a password from a URL for logging.
func redact(spec string) string {
	if i := strings.Index(spec, "://"); i >= 0 {
		rest := spec[i+3:]
		if at := strings.LastIndexByte(strings.SplitN(rest, "/", 2)[0], '@'); at >= 0 {
			cred := rest[:at]
			if user, _, ok := strings.Cut(cred, ":"); ok {
				return spec[:i+3] + user + ":xxxxx" + rest[at:]
			}
		}
	}
	return spec
}

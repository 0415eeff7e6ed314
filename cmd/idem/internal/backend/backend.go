// Package backend opens the stores `idem serve`, `idem proxy` and
// `idem cleanup` run on, from the --db and --store flags.
package backend

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"path/filepath"
	"strings"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/memstore"
	"github.com/idemhq/idem/pgstore"
	"github.com/idemhq/idem/redisstore"
	"github.com/idemhq/idem/sqlitestore"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
)

// Kind names a store backend.
type Kind string

// The backends.
const (
	SQLite   Kind = "sqlite"
	Postgres Kind = "postgres"
	Redis    Kind = "redis"
	Memory   Kind = "memory"
)

// KindOf classifies a --db or --store value: a postgres:// or
// postgresql:// URL (its query parameter idem_schema=NAME chooses the
// records' schema, default "idem"), a redis:// or rediss:// URL (its query
// parameter prefix=TEXT starts every key, default "idem:"), a
// redis+cluster:// or rediss+cluster:// URL (a Redis Cluster, see
// openRedisCluster), "memory", or else a SQLite file path.
func KindOf(spec string) Kind {
	switch {
	case strings.HasPrefix(spec, "postgres://"), strings.HasPrefix(spec, "postgresql://"):
		return Postgres
	case strings.HasPrefix(spec, "redis://"), strings.HasPrefix(spec, "rediss://"):
		return Redis
	case strings.HasPrefix(spec, "redis+cluster://"), strings.HasPrefix(spec, "rediss+cluster://"):
		return RedisCluster
	case spec == "memory":
		return Memory
	}
	return SQLite
}

// Store is an opened records store and what else its backend offers.
// Records is the idem.Store to hand to idem (the middleware, an executor):
// Store itself deliberately is not one, because a wrapper would hide the
// optional capabilities (idem.TxStore, idem.Watcher) the store's own type
// carries.
type Store struct {
	Records idem.Store
	Kind    Kind
	// Where describes the location without credentials, for logs.
	Where string
	// SQLite and PG are set for those backends, so that the application
	// can keep its own tables in the same database.
	SQLite *sqlitestore.Store
	PG     *pgxpool.Pool
	// Ping checks the backend is reachable.
	Ping  func(ctx context.Context) error
	close func() error
}

// Close closes the store and its connections.
func (s *Store) Close() error {
	if s == nil || s.close == nil {
		return nil
	}
	return s.close()
}

// Options tune how Open opens a store.
type Options struct {
	// AsyncClaim commits PostgreSQL claims without waiting for their WAL
	// flush (pgstore.Config.AsyncClaim). Use it only when the operations'
	// effects are written in the same database, in the execution's
	// transaction, which commits synchronously after the claim.
	AsyncClaim bool
}

// Open opens the store named by spec with default options.
func Open(ctx context.Context, spec string) (*Store, error) {
	return OpenWith(ctx, spec, Options{})
}

// OpenWith opens the store named by spec.
func OpenWith(ctx context.Context, spec string, o Options) (*Store, error) {
	if spec == "" {
		return nil, errors.New("no store given")
	}
	switch KindOf(spec) {
	case Postgres:
		// idem_schema=NAME (stripped before the URL reaches pgx) puts the
		// records in another schema than "idem".
		conn, schema, err := cutQuery(spec, "idem_schema")
		if err != nil {
			return nil, fmt.Errorf("postgres: %w", err)
		}
		pool, err := pgxpool.New(ctx, conn)
		if err != nil {
			return nil, fmt.Errorf("postgres: %w", err)
		}
		s, err := pgstore.New(ctx, pool, &pgstore.Config{Schema: schema, AsyncClaim: o.AsyncClaim})
		if err != nil {
			pool.Close()
			return nil, fmt.Errorf("postgres %s: %w", redact(spec), err)
		}
		return &Store{Records: s, Kind: Postgres, Where: "PostgreSQL " + redact(spec), PG: pool,
			Ping:  func(ctx context.Context) error { return pool.Ping(ctx) },
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
		client := redis.NewClient(opts)
		s, err := redisstore.New(client, &redisstore.Config{Prefix: prefix})
		if err != nil {
			client.Close()
			return nil, fmt.Errorf("redis: %w", err)
		}
		// Redis may be down at start: the service starts anyway, answers
		// 503 while it is, and recovers by itself.
		return &Store{Records: s, Kind: Redis, Where: "Redis " + redact(spec),
			Ping:  func(ctx context.Context) error { return client.Ping(ctx).Err() },
			close: client.Close}, nil
	case RedisCluster:
		return openRedisCluster(spec)
	case Memory:
		s, err := memstore.New(nil)
		if err != nil {
			return nil, err
		}
		return &Store{Records: s, Kind: Memory, Where: "memory (this process only)",
			Ping: func(context.Context) error { return nil }}, nil
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
		close: s.Close}, nil
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

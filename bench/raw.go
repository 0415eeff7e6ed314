package main

// The raw systems: HTTP handlers that make the same round trips to the
// store as idem does on the first-execution and replay paths (the same
// statements or scripts, with the same arguments), with none of idem's
// logic around them: no key parsing, fingerprinting, lease renewal,
// header filtering, events or problem documents. They are the physical
// limit of each store behind an HTTP handler; idem's store paths are
// measured as a fraction of them.
//
// The statements and scripts are the stores' own (sqlitestore's and
// pgstore's Statements, redisstore.Scripts), so the raw loops cannot drift
// from what the stores run.

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/pgstore"
	"github.com/idemhq/idem/redisstore"
	"github.com/idemhq/idem/sqlitestore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
)

// rawScope and rawFingerprint are what the raw handlers store: one scope
// (as idem's for the route) and a constant fingerprint of a real one's
// length, since computing it is idem logic.
var (
	rawScope       = idem.Scope("", patternCreate)
	rawFingerprint = "v1:" + string(bytes.Repeat([]byte("5"), 64))
)

const (
	rawLease = 30 * time.Second
	rawTTL   = 24 * time.Hour
)

// rawTokens makes owner tokens as idem does: a prefix and a counter.
var rawTokenSeq atomic.Uint64

func rawToken() string {
	return "raw-" + strconv.FormatUint(rawTokenSeq.Add(1), 36)
}

// rawKey is the key of a request as sent (quotes stripped, nothing
// checked), or "" without one.
func rawKey(r *http.Request) string {
	v := r.Header.Get(idem.HeaderKey)
	if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
		v = v[1 : len(v)-1]
	}
	return v
}

// capture is a minimal buffering ResponseWriter.
type capture struct {
	h      http.Header
	status int
	body   []byte
}

func (c *capture) Header() http.Header { return c.h }
func (c *capture) WriteHeader(s int) {
	if c.status == 0 {
		c.status = s
	}
}

func (c *capture) Write(p []byte) (int, error) {
	if c.status == 0 {
		c.status = http.StatusOK
	}
	c.body = append(c.body, p...)
	return len(p), nil
}

// runApp runs the application handler into a stored response.
func runApp(r *http.Request) *idem.Response {
	c := &capture{h: make(http.Header, 2)}
	appHandler(c, r)
	return &idem.Response{StatusCode: c.status, Header: c.h, Body: c.body}
}

// send writes a response.
func send(w http.ResponseWriter, resp *idem.Response) {
	h := w.Header()
	for k, v := range resp.Header {
		h[k] = v
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = w.Write(resp.Body)
}

// rawMux routes the payments route to h, and everything else to the plain
// application.
func rawMux(h http.HandlerFunc) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc(patternCreate, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(idem.HeaderKey) == "" {
			appHandler(w, r)
			return
		}
		h(w, r)
	})
	return mux
}

// pgClaim is a row of pgstore's claim statement (see Store.Statements).
type pgClaim struct {
	acquired, completed, leaseLive bool
	attempt                        int32
	fingerprint                    string
	response                       []byte
	leaseEnd                       *time.Time
	expiresAt                      time.Time
	fence                          int64
	checkpoint                     []byte
}

func scanPGClaim(row pgx.Row) (pgClaim, error) {
	var c pgClaim
	err := row.Scan(&c.acquired, &c.attempt, &c.fingerprint, &c.completed, &c.response, &c.leaseEnd, &c.leaseLive, &c.expiresAt, &c.fence, &c.checkpoint)
	return c, err
}

// rawPGHandler runs pgstore's claim statement, then (for a new key) the
// application and pgstore's completion statement; a completed key's stored
// response is decoded and sent.
func rawPGHandler(pool *pgxpool.Pool, store *pgstore.Store) http.Handler {
	claimSQL, completeSQL := store.Statements()
	return rawMux(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		key, token := rawKey(r), rawToken()
		c, err := scanPGClaim(pool.QueryRow(ctx, claimSQL, rawScope, key, rawFingerprint, token, rawLease, rawTTL))
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		switch {
		case c.acquired:
			resp := runApp(r)
			enc, _ := resp.MarshalBinary()
			if _, err := pool.Exec(context.WithoutCancel(ctx), completeSQL, rawScope, key, token, enc); err != nil {
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
				return
			}
			send(w, resp)
		case c.completed && c.fingerprint == rawFingerprint:
			var resp idem.Response
			if err := resp.UnmarshalBinary(c.response); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			send(w, &resp)
		default:
			w.WriteHeader(http.StatusConflict)
		}
	})
}

// rawSQLiteHandler runs sqlitestore's statements, prepared once as the
// store prepares them, on the store's own connections: the read of the
// record on the read pool; for a new key, the claim in an immediate
// transaction (the writer's DSN sets _txlock=immediate), the application,
// and the completing UPDATE.
func rawSQLiteHandler(s *sqlitestore.Store) (http.Handler, error) {
	getSQL, claimSQL, completeSQL := s.Statements()
	ctx := context.Background()
	var getRead, claim, complete *sql.Stmt
	for _, p := range []struct {
		dst  **sql.Stmt
		db   *sql.DB
		text string
	}{{&getRead, s.ReadDB(), getSQL}, {&claim, s.DB(), claimSQL}, {&complete, s.DB(), completeSQL}} {
		st, err := p.db.PrepareContext(ctx, p.text)
		if err != nil {
			return nil, err
		}
		*p.dst = st
	}
	type row struct {
		fp             string
		state          int
		lease, expires int64
		response       []byte
	}
	get := func(ctx context.Context, st *sql.Stmt, key string) (row, bool, error) {
		var rw row
		err := st.QueryRowContext(ctx, rawScope, key).Scan(&rw.fp, &rw.state, &rw.lease, &rw.expires, &rw.response)
		if errors.Is(err, sql.ErrNoRows) {
			return rw, false, nil
		}
		return rw, err == nil, err
	}
	fail := func(w http.ResponseWriter, err error) { http.Error(w, err.Error(), http.StatusServiceUnavailable) }
	return rawMux(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		key := rawKey(r)
		now := time.Now()
		rw, found, err := get(ctx, getRead, key)
		if err != nil {
			fail(w, err)
			return
		}
		if found && rw.expires > now.UnixNano() {
			if rw.state == 2 && rw.fp == rawFingerprint {
				var resp idem.Response
				if err := resp.UnmarshalBinary(rw.response); err != nil {
					fail(w, err)
					return
				}
				send(w, &resp)
				return
			}
			w.WriteHeader(http.StatusConflict)
			return
		}
		tx, err := s.DB().BeginTx(ctx, nil)
		if err != nil {
			fail(w, err)
			return
		}
		token := rawToken()
		res, err := tx.StmtContext(ctx, claim).ExecContext(ctx, rawScope, key, rawFingerprint, token,
			now.Add(rawLease).UnixNano(), now.Add(rawTTL).UnixNano(), now.UnixNano())
		if err == nil {
			if n, _ := res.RowsAffected(); n != 1 {
				err = errors.New("the claim changed no row")
			}
		}
		if err == nil {
			err = tx.Commit()
		}
		if err != nil {
			_ = tx.Rollback()
			fail(w, err)
			return
		}
		resp := runApp(r)
		enc, _ := resp.MarshalBinary()
		if _, err := complete.ExecContext(context.WithoutCancel(ctx), enc, rawScope, key, token, time.Now().UnixNano()); err != nil {
			fail(w, err)
			return
		}
		send(w, resp)
	}), nil
}

// rawRedisHandler sends redisstore's claim script, then (for a new key) the
// application and the completion script, by EVALSHA, on a key named
// without hashing.
func rawRedisHandler(ctx context.Context, c *redis.Client, prefix string) (http.Handler, error) {
	claimLua, completeLua := redisstore.Scripts()
	claim, complete := redis.NewScript(claimLua), redis.NewScript(completeLua)
	for _, s := range []*redis.Script{claim, complete} {
		if err := s.Load(ctx, c).Err(); err != nil {
			return nil, err
		}
	}
	lease, ttl := rawLease.Milliseconds(), rawTTL.Milliseconds()
	return rawMux(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		keys := []string{prefix + "raw{" + rawKey(r) + "}"}
		token := rawToken()
		v, err := claim.EvalSha(ctx, c, keys, rawFingerprint, token, lease, ttl).Slice()
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		switch v[0] {
		case int64(1):
			resp := runApp(r)
			enc, _ := resp.MarshalBinary()
			if err := complete.EvalSha(context.WithoutCancel(ctx), c, keys, token, enc).Err(); err != nil {
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
				return
			}
			send(w, resp)
		case int64(2):
			enc, _ := v[5].(string)
			var resp idem.Response
			if err := resp.UnmarshalBinary([]byte(enc)); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			send(w, &resp)
		default:
			w.WriteHeader(http.StatusConflict)
		}
	}), nil
}

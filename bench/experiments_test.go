package main

// Experiments behind the recommendations in FINDINGS.md: each measures a
// change to a store against the store's current way, on the same
// statements, so that the expected gain is a measurement and not a guess.
//
//	go test -run '^$' -bench 'SQLiteGet|PGClaim' -benchtime 3s -count 3 .

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/pgstore"
	"github.com/idemhq/idem/sqlitestore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// BenchmarkSQLiteGet compares sqlitestore's record read (the whole of a
// replay's store work) as the store runs it today, a new statement parsed
// by SQLite on every call, with the same statement prepared once.
func BenchmarkSQLiteGet(b *testing.B) {
	ctx := context.Background()
	s, err := sqlitestore.Open(ctx, filepath.Join(b.TempDir(), "get.db"), nil)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	p := idem.ClaimParams{Scope: rawScope, Key: "k", Fingerprint: rawFingerprint, Token: "t", Lease: time.Minute, TTL: time.Hour, Now: time.Now()}
	if _, err := s.Claim(ctx, p); err != nil {
		b.Fatal(err)
	}
	if err := s.Complete(ctx, idem.CompleteParams{Scope: p.Scope, Key: p.Key, Token: p.Token, Now: p.Now,
		Response: &idem.Response{StatusCode: 201, Body: appBody(100)}}); err != nil {
		b.Fatal(err)
	}
	const q = `SELECT fingerprint, state, lease_until, expires_at, response FROM ` + sqlitestore.DefaultTable + ` WHERE scope = ? AND key = ?`
	stmt, err := s.ReadDB().PrepareContext(ctx, q)
	if err != nil {
		b.Fatal(err)
	}
	defer stmt.Close()
	scan := func(row interface{ Scan(...any) error }) error {
		var (
			fp             string
			state          int
			lease, expires int64
			resp           []byte
		)
		return row.Scan(&fp, &state, &lease, &expires, &resp)
	}
	b.Run("unprepared", func(b *testing.B) {
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if err := scan(s.ReadDB().QueryRowContext(ctx, q, rawScope, "k")); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
	b.Run("prepared", func(b *testing.B) {
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if err := scan(stmt.QueryRowContext(ctx, rawScope, "k")); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}

// BenchmarkPGClaimComplete compares pgstore's first-execution store work
// (the claim statement committed on its own, then the completion) with
// the claim committed asynchronously: BEGIN; SET LOCAL synchronous_commit
// TO OFF; the claim; COMMIT, sent as one pipelined batch (one round trip).
// The completion stays synchronous, and its commit flushes the WAL up to
// and including the claim.
func BenchmarkPGClaimComplete(b *testing.B) {
	url := envOr("IDEM_TEST_POSTGRES_URL", defaultPGURL)
	ctx := context.Background()
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns = 16
	pool, err := pgxpool.NewWithConfig(pctx, cfg)
	if err == nil {
		err = pool.Ping(pctx)
	}
	if err != nil {
		if os.Getenv("CI") == "" {
			b.Skipf("PostgreSQL unreachable: %v", err)
		}
		b.Fatal(err)
	}
	defer pool.Close()
	schema := fmt.Sprintf("idem_bench_exp_%d", time.Now().UnixNano())
	store, err := pgstore.New(ctx, pool, &pgstore.Config{Schema: schema})
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		_, _ = pool.Exec(context.Background(), "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	}()
	claimSQL, completeSQL := store.Statements()
	enc, err := (&idem.Response{StatusCode: 201, Body: appBody(100)}).MarshalBinary()
	if err != nil {
		b.Fatal(err)
	}
	var seq atomic.Int64
	scanClaim := func(row pgx.Row) error {
		c, err := scanPGClaim(row)
		if err == nil && !c.acquired {
			err = fmt.Errorf("not acquired")
		}
		return err
	}
	complete := func(key, token string) error {
		tag, err := pool.Exec(ctx, completeSQL, rawScope, key, token, enc)
		if err == nil && tag.RowsAffected() != 1 {
			err = fmt.Errorf("complete changed %d rows", tag.RowsAffected())
		}
		return err
	}
	// RunParallel runs parallelism × GOMAXPROCS goroutines.
	for _, par := range []int{1, 4} {
		g := par * runtime.GOMAXPROCS(0)
		b.Run(fmt.Sprintf("goroutines=%d/sync", g), func(b *testing.B) {
			b.SetParallelism(par)
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					key := "s" + strconv.FormatInt(seq.Add(1), 10)
					if err := scanClaim(pool.QueryRow(ctx, claimSQL, rawScope, key, rawFingerprint, key, rawLease, rawTTL)); err != nil {
						b.Error(err)
						return
					}
					if err := complete(key, key); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
		b.Run(fmt.Sprintf("goroutines=%d/async-claim", g), func(b *testing.B) {
			b.SetParallelism(par)
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					key := "a" + strconv.FormatInt(seq.Add(1), 10)
					batch := &pgx.Batch{}
					batch.Queue("BEGIN")
					batch.Queue("SET LOCAL synchronous_commit TO OFF")
					batch.Queue(claimSQL, rawScope, key, rawFingerprint, key, rawLease, rawTTL)
					batch.Queue("COMMIT")
					br := pool.SendBatch(ctx, batch)
					_, err1 := br.Exec()
					_, err2 := br.Exec()
					err3 := scanClaim(br.QueryRow())
					_, err4 := br.Exec()
					if err := firstErr(err1, err2, err3, err4, br.Close()); err != nil {
						b.Error(err)
						return
					}
					if err := complete(key, key); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

package drills

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/idemhq/idem/idemstore"
)

// HistoryConfig shapes a random concurrent history.
type HistoryConfig struct {
	// Clients run concurrently, each doing Ops operations on Keys keys.
	Clients, Ops, Keys int
	// Lease and TTL are the claims' lease and retention. Short ones let
	// leases expire (takeovers) and records expire within the history.
	Lease, TTL time.Duration
	// ServerClock declares a store that decides time with its server's
	// clock (pgstore, redisstore). The history then pauses up to Pause
	// between a client's operations, so that real time passes, and an
	// operation took effect somewhere between its call and return,
	// widened by Slack for the server clock's resolution (Redis: 1 ms).
	// Otherwise the history drives a fake clock it passes as Now, moving
	// it forward by up to Pause per operation.
	ServerClock bool
	Pause       time.Duration
	Slack       time.Duration
	// BusyInFlight declares a store that may answer a claim of an
	// in-flight record whose lease has expired with "in flight" when it
	// cannot take the record over promptly (sqlitestore bounds a
	// take-over's wait for the write lock, store.go). That answer never
	// leads to a second execution; the model then allows it.
	BusyInFlight bool
	// OpTimeout bounds each store call. Defaults to 5 s.
	OpTimeout time.Duration
	// Seed makes the operations (not their interleaving) repeatable.
	Seed uint64
}

// Record runs a random concurrent history of claim, renew, complete and
// release on s and returns it for porcupine. Clients complete or release
// the records they own, renew them, and sometimes use a token they no
// longer own; a claim uses another fingerprint one time in twenty. A store
// call that fails without a contract answer is recorded with an unknown
// outcome.
func Record(ctx context.Context, s idemstore.Store, c HistoryConfig) []porcupine.Operation {
	if c.OpTimeout == 0 {
		c.OpTimeout = 5 * time.Second
	}
	var (
		mu      sync.Mutex
		history []porcupine.Operation
		wg      sync.WaitGroup
		fake    atomic.Int64
	)
	fake.Store(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC).UnixNano())
	start := time.Now()
	mono := func() int64 { return int64(time.Since(start)) }
	keys := make([]string, c.Keys)
	for i := range keys {
		keys[i] = fmt.Sprintf("k%d-%d", c.Seed, i)
	}
	for client := range c.Clients {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(c.Seed, uint64(client)))
			held := map[string]string{} // key -> the token this client last acquired it with
			var old []string            // tokens this client owned once
			for n := range c.Ops {
				key := keys[r.IntN(len(keys))]
				in := Input{Key: key, Lease: int64(c.Lease), TTL: int64(c.TTL),
					Token: fmt.Sprintf("c%d-%d", client, n), BusyOK: c.BusyInFlight}
				tok, holds := held[key]
				switch x := r.IntN(100); {
				case holds && x < 25:
					in.Op, in.Token = OpRenew, tok
				case holds && x < 60:
					in.Op, in.Token = OpComplete, tok
					in.Body = fmt.Sprintf("resp-%s-%d", tok, n)
				case holds && x < 70:
					in.Op, in.Token = OpRelease, tok
				case !holds && x < 10 && len(old) > 0:
					// A stale owner acts.
					in.Op, in.Token = []string{OpRenew, OpComplete, OpRelease}[r.IntN(3)], old[r.IntN(len(old))]
					in.Body = fmt.Sprintf("resp-%s-%d", in.Token, n)
				default:
					in.Op, in.Fingerprint = OpClaim, "v1:a"
					if r.IntN(20) == 0 {
						in.Fingerprint = "v1:b"
					}
				}
				var now time.Time
				if c.ServerClock {
					if c.Pause > 0 {
						pause(ctx, time.Duration(r.Int64N(int64(c.Pause))))
					}
				} else {
					now = time.Unix(0, fake.Add(r.Int64N(int64(c.Pause)+1))).UTC()
				}
				op := porcupine.Operation{ClientId: client, Call: mono()}
				wall := time.Now().UnixNano()
				out := do(ctx, s, c, in, now)
				op.Return = mono()
				if c.ServerClock {
					in.TLo, in.THi = wall-int64(c.Slack), time.Now().UnixNano()+int64(c.Slack)
				} else {
					in.TLo, in.THi = now.UnixNano(), now.UnixNano()
				}
				if out.Outcome == OutUnknown {
					// It may take effect at any later instant (a request
					// still travelling to the store).
					op.Return = Forever
					in.THi = in.TLo + int64(time.Hour)
				}
				op.Input, op.Output = in, out
				mu.Lock()
				history = append(history, op)
				mu.Unlock()
				switch {
				case in.Op == OpClaim && (out.Outcome == OutAcquired || out.Outcome == OutTookOver):
					held[key] = in.Token
					old = append(old, in.Token)
				case in.Op == OpComplete || in.Op == OpRelease || out.Outcome == OutLeaseLost:
					if held[key] == in.Token {
						delete(held, key)
					}
				}
			}
		})
	}
	wg.Wait()
	return history
}

// do runs one operation and translates its answer.
func do(ctx context.Context, s idemstore.Store, c HistoryConfig, in Input, now time.Time) Output {
	ctx, cancel := context.WithTimeout(ctx, c.OpTimeout)
	defer cancel()
	var err error
	switch in.Op {
	case OpClaim:
		var res idemstore.ClaimResult
		res, err = s.Claim(ctx, idemstore.ClaimParams{Scope: "lin", Key: in.Key, Fingerprint: in.Fingerprint,
			Token: in.Token, Lease: c.Lease, TTL: c.TTL, Now: now})
		if err != nil {
			return Output{Outcome: OutUnknown}
		}
		switch res.Outcome {
		case idemstore.ClaimAcquired:
			if res.TookOver {
				return Output{Outcome: OutTookOver}
			}
			return Output{Outcome: OutAcquired}
		case idemstore.ClaimCompleted:
			if res.Record.Response == nil {
				return Output{Outcome: OutCompleted, Body: "<no response>"}
			}
			return Output{Outcome: OutCompleted, Body: string(res.Record.Response.Body)}
		case idemstore.ClaimInFlight:
			return Output{Outcome: OutInFlight}
		case idemstore.ClaimMismatch:
			return Output{Outcome: OutMismatch}
		}
		return Output{Outcome: "outcome " + res.Outcome.String()}
	case OpRenew:
		err = s.Renew(ctx, idemstore.RenewParams{Scope: "lin", Key: in.Key, Token: in.Token, Lease: c.Lease, Now: now})
	case OpComplete:
		err = s.Complete(ctx, idemstore.CompleteParams{Scope: "lin", Key: in.Key, Token: in.Token, Now: now,
			Response: &idemstore.Response{StatusCode: 201, Body: []byte(in.Body)}})
	case OpRelease:
		err = s.Release(ctx, idemstore.ReleaseParams{Scope: "lin", Key: in.Key, Token: in.Token, Now: now})
	}
	switch {
	case err == nil:
		return Output{Outcome: OutOK}
	case errors.Is(err, idemstore.ErrLeaseLost):
		return Output{Outcome: OutLeaseLost}
	}
	return Output{Outcome: OutUnknown}
}

// pause waits d or until ctx ends. It lets real time pass for a
// server-clock store; nothing synchronises on it.
func pause(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// Check checks h for linearizability against Model and fails t if it is
// not, saving the history as an HTML visualisation in t's artifact
// directory (kept with `go test -artifacts`, else a temporary one) and
// naming it in the failure.
func Check(t *testing.T, name string, h []porcupine.Operation) {
	t.Helper()
	res, info := porcupine.CheckOperationsVerbose(Model(), h, time.Minute)
	switch res {
	case porcupine.Ok:
		return
	case porcupine.Unknown:
		t.Errorf("%s: the linearizability check of %d operations timed out", name, len(h))
		return
	}
	path := filepath.Join(t.ArtifactDir(), name+".html")
	if err := porcupine.VisualizePath(Model(), info, path); err != nil {
		t.Errorf("%s: writing the visualisation: %v", name, err)
	}
	t.Errorf("%s: history of %d operations is not linearizable against the Store contract; visualisation: %s",
		name, len(h), path)
}

// Unknowns counts the operations of h whose outcome is unknown.
func Unknowns(h []porcupine.Operation) int {
	n := 0
	for _, op := range h {
		if op.Output.(Output).Outcome == OutUnknown {
			n++
		}
	}
	return n
}

// Outcomes counts the operations of h by operation and outcome, to show
// what a history exercised (takeovers, stale owners, replays).
func Outcomes(h []porcupine.Operation) map[string]int {
	m := map[string]int{}
	for _, op := range h {
		m[op.Input.(Input).Op+":"+op.Output.(Output).Outcome]++
	}
	return m
}

// Package idemstore is the store author's API of idem: the [Store]
// interface, its parameters and results, its sentinel errors and its
// optional capabilities. An application that only uses idem needs none of
// it beyond a store's constructor: it passes a store to
// [github.com/idemhq/idem.NewMiddleware] or
// [github.com/idemhq/idem.NewExecutor]. This page is for people who write a
// store, a decorator of one, or an operator tool.
//
// # The contract
//
// A store keeps idempotency records. A record is named by a scope and a
// key, holds the fingerprint of the request that claimed it, and is in one
// of two states:
//
//   - in flight: owned by one owner token under a lease (and, for a
//     multi-step operation, holding a checkpoint);
//   - completed: holding the [Response] to replay.
//
// Records expire at [Record.ExpiresAt] and then behave as absent. The
// methods of [Store] state the rules in their doc comments: what Claim
// answers in each case, that Renew, Complete and Release change nothing
// unless the token owns the record ([ErrLeaseLost]), that a take-over
// never extends a record's retention. The doc comments name the exact
// sentinel error for each refusal; callers test them with errors.Is.
//
// # Atomicity
//
// Every method is one atomic step: concurrent calls from any number of
// goroutines or processes behave as if run one at a time. In particular,
// two claims of the same key never both acquire it, and a take-over
// replaces exactly one expired owner. Build the step from the backend's own
// primitives (a transaction, INSERT … ON CONFLICT, a Lua script), never
// from a read followed by a separate write.
//
// # Clocks
//
// Time is decided in one place. A store either uses the Now in its
// parameters (the core's one clock; memstore, sqlitestore) or its server's
// clock for every decision (pgstore, mysqlstore, redisstore), and says which
// in its documentation. It never mixes the two and never calls time.Now
// itself: a lease measured by one clock and checked by another ends too
// early or too late.
//
// # Fencing
//
// A claim that acquires or takes over a record returns a fencing token in
// [Record.Fence], greater than the token of every earlier claim of the same
// key, across releases and expiry too. Draw it from one counter per store
// that never goes back (a sequence, a counter row, INCR). Handlers send it
// to downstream systems, which refuse the writes of a stale owner.
//
// # Optional capabilities
//
// A store offers more through interfaces the core finds by type
// assertion:
//
//   - [TxStore] and [Tx]: the operation's writes and the stored response
//     commit in one transaction (with [TxRenewer] for stores that
//     serialise writers);
//   - [TxClaimer]: the claim of a new key in that transaction too
//     (Config.ClaimInTx);
//   - [Watcher]: wake-ups for wait mode instead of polling;
//   - [StepStore] and [CheckpointTx]: recovery points of multi-step
//     operations;
//   - [Inspector]: the operator commands (idem inspect, ls, delete).
//
// A decorator of a store (a wrapper that counts, traces or injects faults)
// must implement the same optional interfaces as the store it wraps, or
// the core loses them.
//
// # Proving a store
//
// The conformance suite [github.com/idemhq/idem/storetest] checks a store
// against this whole contract, its optional capabilities included, on
// fresh, isolated stores in parallel subtests:
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, storetest.Harness{NewStore: newIsolatedStore})
//	}
//
// storetest.RunAtRest checks encryption at rest through the middleware,
// reading what the backend holds with its own client, and
// storetest.Benchmark gives numbers every store can be compared by.
//
// # Stability
//
// This API changes only in a minor release, never in a patch release, and
// every change is listed in CHANGELOG.md with what a store must do. New
// abilities arrive as new optional interfaces, and new parameter fields
// whose zero value keeps the previous behaviour, so that an existing store
// keeps compiling and passing storetest. Removing or changing the meaning
// of a Store method waits for a major version once idem reaches v1.
package idemstore

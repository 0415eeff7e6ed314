// Package idem makes HTTP handlers, and any other operation, safe to retry.
// It implements the Idempotency-Key pattern of the IETF draft "The
// Idempotency-Key HTTP Header Field": a client sends a unique key with a
// request and reuses it on every retry; idem claims (scope, key) atomically
// in a durable store, runs the handler once, stores its response and replays
// it to every retry. The contract, with every status code and header, is
// docs/semantics.md.
//
// # The four outcomes
//
// A request that carries a key ends in exactly one of these:
//
//   - A new key: the handler runs. Its response is stored (2xx, 3xx and
//     deterministic 4xx) or released (5xx, 408, 425, 429: the client may
//     retry with the same key and the handler runs again), as
//     Config.OutcomeFunc decides.
//   - A retry of a completed request: the stored response is replayed,
//     with Idempotency-Replayed: true. The handler does not run.
//   - A retry while the first attempt still runs: 409
//     idempotency.request_in_progress with Retry-After, or, with
//     Config.Wait, the first attempt's response once it is stored.
//   - The same key with a different request (method, operation or
//     payload, compared by fingerprint): 422 idempotency.key_reused.
//
// Errors are RFC 9457 problem+json bodies with a stable code (the Code
// constants). idem fails closed: if the store cannot be reached, or does
// not answer within Config.StoreTimeout, the handler does not run and the
// answer is 503 idempotency.store_unavailable with Retry-After.
//
// # Middleware
//
// NewMiddleware wraps net/http handlers. By default POST and PATCH need a
// key; other methods pass through untouched:
//
//	store, err := memstore.New(nil) // or sqlitestore, pgstore, redisstore
//	if err != nil { ... }
//	mw, err := idem.NewMiddleware(store, nil) // nil: every default
//	if err != nil { ... }
//	mux.Handle("POST /payments", mw.Handle(createPayment))
//
// Config adjusts the middleware: the lease and TTL of records, which
// requests need a key, the tenant a request belongs to (records of two
// tenants never meet), the payload that is fingerprinted, and the limits
// on bodies. Handlers read the key and record of their execution with
// InfoFromContext.
//
// # Transactional handlers
//
// With a store that implements TxStore (sqlitestore, pgstore), a handler
// writes its business rows through the execution's transaction. They
// commit together with the stored response, before the response is sent,
// and roll back if the handler fails, panics or loses its lease: after a
// crash either both exist or neither.
//
//	func createPayment(w http.ResponseWriter, r *http.Request) {
//		tx, err := sqlitestore.Tx(r.Context()) // *sql.Tx; pgstore.Tx gives a pgx.Tx
//		if err != nil {
//			http.Error(w, "store unavailable", http.StatusServiceUnavailable)
//			return
//		}
//		if _, err := tx.ExecContext(r.Context(), `INSERT INTO payments ...`); err != nil {
//			http.Error(w, "cannot record the payment", http.StatusServiceUnavailable) // released
//			return
//		}
//		w.WriteHeader(http.StatusCreated) // committed with the payment
//	}
//
// # Non-HTTP work
//
// Executor gives message consumers, job runners and RPC servers the same
// semantics without net/http: Executor.Do runs an Operation at most once
// per (scope, key) and returns its Result, or the stored one. Build the
// scope with Scope and the fingerprint with Fingerprint, as the middleware
// does. Module idemgrpc builds unary gRPC interceptors on it.
//
// # Integrations
//
// Adapters are modules of their own, so that importing idem downloads no
// framework: idemgin and idemecho (middleware for gin and echo), idemgrpc
// (gRPC interceptors) and idemotel (OpenTelemetry metrics and spans
// through Config.Observer; an Observer that also implements PhaseObserver
// is called around each phase of a request).
//
// # Multi-step operations
//
// An operation that calls something it cannot roll back (a card provider)
// is written as named steps with Step: each step runs at most once per key,
// and its recovery point commits with the step's own writes; an attempt
// that dies is resumed by the next one after its last committed step.
// DeriveKey gives the key to send downstream for a step (the same on every
// attempt, revealing nothing of the client's key), FenceFromContext a
// fencing token that grows with every claim of the key, and
// Executor.Reconcile completes operations nobody retried, several at once,
// and holds for an operator those it gives up on
// (ReconcileParams.MaxAttempts, MaxAge). It needs a store that implements
// StepStore (memstore, sqlitestore, pgstore).
//
// # Stores
//
// memstore (in this module) keeps records in one process's memory, for
// tests and single-instance services. Each of the others is its own
// module, so importing idem downloads no database client: sqlitestore
// (an SQLite file, transactional), pgstore (PostgreSQL through pgx,
// transactional), redisstore (Redis or Valkey). Every store passes the
// conformance suite in storetest.
//
// # Encryption at rest
//
// Config.Encryption (see idemcrypt.New) seals every stored response and
// every recovery point (see Step) with AES-256-GCM under a data key of its
// own, wrapped by a KeyProvider (the static Keyring, or a KMS) and bound to
// its record; optionally stores see only an HMAC of scope and key. It works
// in the core, on what Complete and SaveCheckpoint receive and Claim and
// Stuck return, so every store gets it. A record that cannot be decrypted
// answers ErrRecordUnreadable (503), never a replay, a resumption or a
// second execution. idemcrypt.Config.AcceptPlaintext reads the records
// written before encryption was turned on.
//
// # For store authors
//
// A store implements Store: five methods (Claim, Renew, Complete, Release,
// DeleteExpired) whose doc comments are the contract, with the argument
// types ClaimParams, RenewParams, CompleteParams, ReleaseParams and
// DeleteExpiredParams, the results ClaimResult and Record, and the
// sentinel errors ErrLeaseLost, ErrResponseTooLarge and ErrStoreFull.
// Optional capabilities are separate interfaces the core finds by type
// assertion: TxStore (with StoreTx, and TxRenewer for stores that
// serialise writers) for transactional completion, TxClaimer for claims
// made inside the operation's transaction (Config.ClaimInTx), Watcher for wait
// mode, StepStore (with CheckpointTx) for the recovery points of
// multi-step operations, and Inspector (Get, List, Delete with ErrNotFound;
// inspect.go) for the operator commands idem inspect, idem ls and idem
// delete. Response's MarshalBinary and UnmarshalBinary give stores a compact
// encoding of a stored response. storetest.Run checks an implementation
// against the whole contract. store.go holds all of it (inspect.go the
// operator capability); an application that only uses idem never needs
// these names.
//
// Stability: the store API changes only in a minor release, never in a
// patch release, and every change is listed in CHANGELOG.md with what a
// store must do. New abilities arrive as new optional interfaces, and new
// parameter fields whose zero value keeps the previous behaviour, so that an
// existing store keeps compiling and passing storetest. Removing or changing
// the meaning of a Store method waits for a major version once idem reaches
// v1.
package idem

// Package idem makes HTTP handlers, and any other operation, safe to retry.
//
// A client sends a unique Idempotency-Key with a request and reuses it on
// every retry. idem claims the key in a durable store, runs the handler
// once, stores its response and replays it to every retry. This is the
// pattern of the IETF draft "The Idempotency-Key HTTP Header Field". The
// full contract, with every status code and header, is docs/semantics.md.
//
// # Quick start
//
// [NewMiddleware] wraps net/http handlers. By default POST and PATCH need a
// key; other methods pass through:
//
//	store, err := sqlitestore.Open(ctx, "idem.db", nil) // or memstore, pgstore, redisstore
//	if err != nil { ... }
//	mw, err := idem.NewMiddleware(store, nil) // nil: every default
//	if err != nil { ... }
//	mux.Handle("POST /payments", mw.Handle(createPayment))
//
// A handler reads its key, scope and fence with [InfoFromContext].
//
// # What a request gets
//
// A request that carries a key ends in one of four ways:
//
//   - A new key: the handler runs. Its response is stored, or released when
//     it is a 5xx, 408, 425 or 429. A released key may be retried.
//   - A retry of a completed request: the stored response is replayed
//     byte for byte, with Idempotency-Replayed: true.
//   - A retry while the first attempt runs: 409 with Retry-After. With
//     [Config].Wait the retry waits and replays instead.
//   - The same key with another payload: 422.
//
// Errors are RFC 9457 problem+json bodies with a stable code (the Code
// constants, such as [CodeKeyMissing]). idem fails closed: when the store
// does not answer within [Config].StoreTimeout, the handler does not run
// and the client gets 503 with Retry-After.
//
// # Configuration
//
// [Config] sets the lease and TTL of records, which requests need a key
// ([KeyRequirement]), the tenant of a request, the payload that is
// fingerprinted ([Config].FingerprintFunc) and the limits on bodies. Two
// tenants' records never meet: the scope is the tenant plus the operation
// ([Scope]).
//
// # Transactional handlers
//
// With sqlitestore or pgstore, a handler writes its rows through the
// execution's transaction. The rows commit with the stored response,
// before the response is sent. After a crash, either both exist or
// neither:
//
//	func createPayment(w http.ResponseWriter, r *http.Request) {
//		tx, err := sqlitestore.Tx(r.Context()) // a *sql.Tx; pgstore.Tx gives a pgx.Tx
//		if err != nil { ... }
//		if _, err := tx.ExecContext(r.Context(), `INSERT INTO payments ...`); err != nil { ... }
//		w.WriteHeader(http.StatusCreated)
//	}
//
// [Config].ClaimInTx also puts the claim in that transaction: one commit per
// first execution instead of two.
//
// # Work that is not HTTP
//
// [Executor] gives message consumers, job runners and RPC servers the same
// guarantees. [Executor.Do] runs an [Operation] at most once per scope and
// key and returns its [Result], or the stored one. Package inbox uses it to
// book each message once; idemgrpc and idemconnect build interceptors on it.
//
// # Calls you cannot roll back
//
// An operation that charges a card is written as named steps with [Step].
// Each step runs at most once per key, and its recovery point commits with
// its own writes. An attempt that dies is resumed after its last committed
// step. [DeriveKey] gives the key to send downstream for a step: the same on
// every attempt, revealing nothing of the client's key. [RequestInfo].Fence
// grows with every claim of the key, so a downstream system can refuse a
// stale owner. [Executor.Reconcile] finishes operations nobody retried and
// holds for an operator those it gives up on.
//
// # Stores
//
// memstore keeps records in memory, for tests and one process. The others
// are modules of their own, so importing idem downloads no database
// client: sqlitestore (an SQLite file), pgstore (PostgreSQL) and
// redisstore (Redis or Valkey). Every store passes the suite in storetest.
// Package idemstore is the API for people who write a store.
//
// # Integrations
//
// Adapters are modules too: idemgin, idemecho, idemfiber, idemgrpc, idemconnect,
// idemnats, idemamqp, idemkafka and idemotel. chi and Huma use the
// middleware as it is.
//
// # Encryption at rest
//
// [Config].Encryption, built by idemcrypt.New, seals every stored response
// and recovery point with AES-256-GCM. A record that cannot be decrypted
// answers [ErrRecordUnreadable] (503): never a replay, a resumption or a
// second execution.
//
// # Observing
//
// [Config].Observer receives an [Event] for every request. An [Observer]
// that is also a [PhaseObserver] is called around each [Phase]. idemotel
// turns both into OpenTelemetry metrics and spans. Keys in logs go through
// [RedactKey].
package idem

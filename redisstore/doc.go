// Package redisstore is an idemstore.Store backed by Redis (or Valkey), for
// services that run several instances and already operate Redis.
//
// # Guarantee
//
// Redis cannot take part in the business database's transaction, so this
// store does not implement idemstore.TxStore. It gives the lease-and-fencing
// guarantee instead: one attempt at a time owns a key, under a lease it
// renews while the operation runs; only the owner's token can complete or
// release the record, so a stalled attempt whose lease was taken over
// changes nothing. An attempt that crashes after its business write but
// before Complete leaves an in-flight record whose lease runs out; the next
// retry then takes it over and runs the operation again. Give the business
// operation its own uniqueness (for example a unique column holding a value
// derived from the idempotency key) if that second run must not repeat its
// effect.
//
// # Fences and steps
//
// Claims return a fencing token (idemstore.Record.Fence): the Redis clock in
// microseconds when the key is claimed, or the record's previous fence plus
// one if that is not greater, so a key's fences grow across take-overs,
// releases and expiry as long as the Redis clock does not go back (a
// failover to a replica whose clock is behind could break that; a downstream
// system that must be safe from it keeps its own counter). The store does
// not implement idemstore.StepStore: recovery points need a transaction with the
// business writes, so idem.Step returns idem.ErrStepsUnsupported on it.
//
// # Atomicity and time
//
// Every store call is one Lua script (run by EVALSHA, falling back to EVAL
// when Redis has not seen the script), so each transition is a single
// atomic step on the server: a first execution costs two round trips (claim,
// complete), a replay one. Every lease and retention decision is made by
// the Redis server's clock (TIME, and the key's Redis expiry), never by
// the Now passed in the parameters: instances with skewed clocks cannot
// steal each other's leases or see records expire early. Requires Redis
// 5.0 or later (scripts that call TIME before writing need effects
// replication, the default since 5.0).
//
// # Keys and retention
//
// A record is one hash at Prefix + "{" + hex(SHA-256(scope, key)) + "}"
// (see Store.Key), with the Redis expiry set to the end of its retention.
// Redis deletes expired records itself: DeleteExpired has nothing to do and
// returns 0. Idempotency keys and scopes are never stored in clear, so
// idemstore.Inspector's List (idem ls) names records by their Redis key
// (RecordInfo.ID, which Get and Delete take back), walks SCAN (a record may
// be listed twice if Redis shrinks its table during a walk) and cannot
// search by key (idemstore.ErrKeySearchUnsupported). Run Redis
// with maxmemory-policy noeviction (its default): every record has an expiry,
// so the volatile-* policies may evict records early, and an evicted record
// lets a retry run the operation again.
//
// # Cluster and Sentinel
//
// New takes a redis.UniversalClient: a *redis.Client, a
// *redis.ClusterClient or a Sentinel-backed failover client all work. Each
// call touches one key whose name carries a hash tag, so it runs on one
// Cluster node whatever the scope and key contain.
//
// # Durability
//
// Redis replicates asynchronously. If the primary fails after acknowledging
// a claim or a completion but before a replica received it, the promoted
// replica does not have it: a retry then finds no record (or an in-flight
// one) and runs the operation again. Persistence settings (appendfsync) do
// not close this window on failover; WAIT can narrow it but is not used
// here. Where a duplicate after a failover is unacceptable, use the
// business database's own uniqueness as above, or a transactional store
// (pgstore, sqlitestore).
package redisstore

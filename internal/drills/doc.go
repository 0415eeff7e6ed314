// Package drills holds what checks idem's stores beyond the conformance
// suite: a porcupine model of the Store contract (Model) with a recorder of
// random concurrent histories (Record, Check), and, in its tests, the
// linearizability checks of every store, toxiproxy faults between idem and
// Redis or PostgreSQL, the Redis Cluster and PostgreSQL failover drills and
// the sizing measurement. docs/operations.md reports their results and how
// to run the long versions (IDEM_DRILL_LONG=1, IDEM_SIZING_RECORDS=N).
//
// The module is part of the workspace but not published: its dependencies
// (toxiproxy, porcupine) never reach idem's users.
package drills

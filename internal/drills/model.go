package drills

import (
	"fmt"
	"math"

	"github.com/anishathalye/porcupine"
)

// The operations of a history.
const (
	OpClaim    = "claim"
	OpRenew    = "renew"
	OpComplete = "complete"
	OpRelease  = "release"
)

// The outcomes an operation can return.
const (
	OutAcquired  = "acquired"  // Claim: a new record
	OutTookOver  = "took-over" // Claim: an in-flight record whose lease had expired
	OutInFlight  = "in-flight" // Claim: a live lease of another owner
	OutCompleted = "completed" // Claim: the stored response (Output.Body)
	OutMismatch  = "mismatch"  // Claim: another fingerprint
	OutOK        = "ok"        // Renew, Complete, Release
	OutLeaseLost = "lease-lost"
	// OutUnknown is an operation that failed without a contract answer (a
	// timeout, a cut connection): it may or may not have taken effect, at
	// any time after its call.
	OutUnknown = "unknown"
)

// Input is one operation on the store. Times are nanoseconds on the clock
// the store decides with: the injected Now for stores that take it, the
// wall clock for stores that use their server's clock. The operation took
// effect at some instant in [TLo, THi]: exactly Now for the former, the
// call and return times (widened by the clock's resolution) for the
// latter.
type Input struct {
	Op          string
	Key         string
	Fingerprint string
	Token       string
	Body        string // Complete's response body, unique per completion
	Lease, TTL  int64
	TLo, THi    int64
	// BusyOK allows a claim to answer "in flight" for a record whose
	// lease has expired (HistoryConfig.BusyInFlight).
	BusyOK bool
}

// Output is what the store answered.
type Output struct {
	Outcome string
	Body    string // the replayed body with OutCompleted
}

// state is the model's view of one key: the record, with the instants
// that depend on when an operation took effect kept as intervals.
type state struct {
	Present, Completed bool
	Fingerprint, Token string
	Body               string
	LeaseLo, LeaseHi   int64
	ExpLo, ExpHi       int64
}

// Model is the idemstore.Store contract (store.go, docs/semantics.md) for
// porcupine, one key per partition. It is nondeterministic where the
// history cannot tell what the store saw: whether a lease or the retention
// had ended at an instant known only to an interval, and whether an
// operation with an unknown outcome took effect.
func Model() porcupine.Model {
	m := porcupine.NondeterministicModel{
		Partition: func(h []porcupine.Operation) [][]porcupine.Operation {
			byKey := map[string][]porcupine.Operation{}
			var keys []string
			for _, op := range h {
				k := op.Input.(Input).Key
				if _, ok := byKey[k]; !ok {
					keys = append(keys, k)
				}
				byKey[k] = append(byKey[k], op)
			}
			out := make([][]porcupine.Operation, 0, len(keys))
			for _, k := range keys {
				out = append(out, byKey[k])
			}
			return out
		},
		Init: func() []any { return []any{state{}} },
		Step: func(s, in, out any) []any { return step(s.(state), in.(Input), out.(Output)) },
		DescribeOperation: func(in, out any) string {
			i, o := in.(Input), out.(Output)
			switch i.Op {
			case OpClaim:
				s := fmt.Sprintf("claim(%s, fp %s) -> %s", i.Token, i.Fingerprint, o.Outcome)
				if o.Outcome == OutCompleted {
					s += " " + o.Body
				}
				return s
			case OpComplete:
				return fmt.Sprintf("complete(%s, %s) -> %s", i.Token, i.Body, o.Outcome)
			}
			return fmt.Sprintf("%s(%s) -> %s", i.Op, i.Token, o.Outcome)
		},
		DescribeState: func(s any) string {
			st := s.(state)
			switch {
			case !st.Present:
				return "absent"
			case st.Completed:
				return fmt.Sprintf("completed %s (fp %s)", st.Body, st.Fingerprint)
			}
			return fmt.Sprintf("in flight, owner %s (fp %s)", st.Token, st.Fingerprint)
		},
	}
	return m.ToModel()
}

// step returns every state the record can be in after in returned out,
// or none if out is impossible.
func step(s state, in Input, out Output) []any {
	if out.Outcome == OutUnknown {
		// Not taken effect, or taken effect with any answer.
		next := []any{s}
		for _, o := range possibleOutcomes(in) {
			next = append(next, step(s, in, o)...)
		}
		return next
	}
	var next []any
	// The worlds the operation may have met: the record gone (absent, or
	// its retention ended by the instant of the operation) or present.
	if !s.Present || s.ExpLo <= in.THi {
		expired := s.Present
		next = append(next, stepOn(state{}, expired, in, out)...)
	}
	if s.Present && s.ExpHi > in.TLo {
		next = append(next, stepOn(s, false, in, out)...)
	}
	return next
}

// possibleOutcomes lists the answers in could have had.
func possibleOutcomes(in Input) []Output {
	if in.Op != OpClaim {
		return []Output{{Outcome: OutOK}, {Outcome: OutLeaseLost}}
	}
	// A replay's body cannot be guessed, but an operation whose answer was
	// lost does not replay anything the client saw: the body is checked
	// only where the client got it.
	return []Output{{Outcome: OutAcquired}, {Outcome: OutTookOver}}
}

// stepOn steps in on the record s that is known to exist (or to be absent)
// at the operation's instant. wasExpired says that an expired record was
// there: a store may report its replacement as a takeover.
func stepOn(s state, wasExpired bool, in Input, out Output) []any {
	owned := s.Present && !s.Completed && s.Token == in.Token
	switch in.Op {
	case OpClaim:
		fresh := state{Present: true, Fingerprint: in.Fingerprint, Token: in.Token,
			LeaseLo: in.TLo + in.Lease, LeaseHi: in.THi + in.Lease,
			ExpLo: in.TLo + in.TTL, ExpHi: in.THi + in.TTL}
		switch {
		case !s.Present:
			if out.Outcome == OutAcquired || (wasExpired && out.Outcome == OutTookOver) {
				return []any{fresh}
			}
		case s.Fingerprint != in.Fingerprint:
			if out.Outcome == OutMismatch {
				return []any{s}
			}
		case s.Completed:
			if out.Outcome == OutCompleted && out.Body == s.Body {
				return []any{s}
			}
		default:
			// Live if the lease ends after the instant; expired if at or
			// before it.
			if out.Outcome == OutInFlight && (s.LeaseHi > in.TLo || in.BusyOK) {
				return []any{s}
			}
			if out.Outcome == OutTookOver && s.LeaseLo <= in.THi {
				// A take-over never extends the record's retention.
				took := fresh
				took.ExpLo, took.ExpHi = s.ExpLo, s.ExpHi
				return []any{took}
			}
		}
		return nil
	case OpRenew:
		if owned && out.Outcome == OutOK {
			s.LeaseLo, s.LeaseHi = in.TLo+in.Lease, in.THi+in.Lease
			return []any{s}
		}
	case OpComplete:
		if owned && out.Outcome == OutOK {
			s.Completed, s.Token, s.Body = true, "", in.Body
			s.LeaseLo, s.LeaseHi = 0, 0
			return []any{s}
		}
	case OpRelease:
		if owned && out.Outcome == OutOK {
			return []any{state{}}
		}
	}
	if !owned && out.Outcome == OutLeaseLost {
		return []any{s}
	}
	return nil
}

// Forever is the return time of an operation whose outcome is unknown: it
// may take effect at any point after its call.
const Forever = math.MaxInt64

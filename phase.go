package idem

import "context"

// Phase is one step of an idempotent request, as a PhaseObserver sees it.
type Phase int

// The phases, in the order a request meets them.
const (
	// PhaseClaim is one Store.Claim call (a waiting duplicate claims again
	// after each wake-up).
	PhaseClaim Phase = iota + 1
	// PhaseExecute is the operation (the handler) running under the claim.
	PhaseExecute
	// PhaseComplete stores the outcome: Store.Complete, or on a TxStore
	// the transactional completion and the commit.
	PhaseComplete
	// PhaseRelease deletes the record after an execution whose outcome is
	// not stored (an error, a panic, a 5xx), so that the key can be used
	// again.
	PhaseRelease
	// PhaseReplay hands out the stored response of a completed record.
	PhaseReplay
)

var phaseNames = [...]string{
	PhaseClaim:    "claim",
	PhaseExecute:  "execute",
	PhaseComplete: "complete",
	PhaseRelease:  "release",
	PhaseReplay:   "replay",
}

func (p Phase) String() string {
	if p > 0 && int(p) < len(phaseNames) {
		return phaseNames[p]
	}
	return "unknown"
}

// PhaseInfo describes the request a phase belongs to.
type PhaseInfo struct {
	// Operation names the operation (the route pattern for the middleware).
	Operation string
	// KeyHash is RedactKey of the idempotency key: never the key itself.
	KeyHash string
}

// PhaseObserver is an optional Observer capability for tracing (idemotel
// makes each phase a span). When Config.Observer implements it, the core
// calls StartPhase as each phase begins, runs the phase in the context it
// returns (so the operation's own spans nest in the execute phase's span),
// and calls the returned function once, with the phase's error (nil on
// success), when the phase ends. Both run on the request's goroutine and
// must return quickly.
type PhaseObserver interface {
	StartPhase(ctx context.Context, ph Phase, info PhaseInfo) (context.Context, func(err error))
}

// phase starts ph for p's request if the observer traces phases.
func (e *Executor) phase(ctx context.Context, ph Phase, p *DoParams) (context.Context, func(error)) {
	if e.phases == nil {
		return ctx, endNothing
	}
	return e.phases.StartPhase(ctx, ph, PhaseInfo{Operation: p.Operation, KeyHash: RedactKey(p.Key)})
}

func endNothing(error) {}

package idemkafka

import "github.com/idemhq/idem/inbox"

// ErrCrashed is what Consume returns after a test hook crashed it.
var ErrCrashed = errCrashed

// Hooks are the test hooks of a ConsumeConfig (see testHooks).
type Hooks struct {
	// BeforeProcess and AfterProcess crash the consumer when they return
	// true: Consume returns ErrCrashed without committing anything more,
	// as a process killed at that point would.
	BeforeProcess, AfterProcess func(m inbox.Message) bool
	// CommitFirst commits each record's offset before handling it.
	CommitFirst bool
}

// WithHooks sets cfg's test hooks and returns cfg.
func WithHooks(cfg *ConsumeConfig, h Hooks) *ConsumeConfig {
	cfg.hooks = &testHooks{beforeProcess: h.BeforeProcess, afterProcess: h.AfterProcess, commitFirst: h.CommitFirst}
	return cfg
}

package outbox

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"
)

// Defaults of Config.
const (
	DefaultBatchSize       = 100
	DefaultLease           = 30 * time.Second
	DefaultPollInterval    = 100 * time.Millisecond
	DefaultPublishTimeout  = 5 * time.Second
	DefaultMinBackoff      = 100 * time.Millisecond
	DefaultMaxBackoff      = 10 * time.Second
	DefaultRetention       = 24 * time.Hour
	DefaultCleanupInterval = time.Minute
	DefaultCleanupBatch    = 1000
	// storeTimeout bounds each store call the dispatcher makes.
	storeTimeout = 10 * time.Second
)

// Config configures a Dispatcher. A nil *Config means all defaults; a zero
// field means its default.
type Config struct {
	// BatchSize is how many messages one claim takes. Defaults to 100.
	BatchSize int
	// Lease is how long a claim holds its messages; a dispatcher that dies
	// leaves them to be claimed by another after it. It must be longer
	// than publishing a batch takes: the dispatcher stops publishing a
	// batch (and releases the rest) once half of it has passed. Defaults
	// to 30 seconds.
	Lease time.Duration
	// PollInterval is how long the dispatcher waits for new messages after
	// a claim found fewer than BatchSize; Notify wakes it earlier.
	// Defaults to 100 milliseconds.
	PollInterval time.Duration
	// PublishTimeout bounds one Publisher.Publish call. Defaults to 5
	// seconds.
	PublishTimeout time.Duration
	// MinBackoff and MaxBackoff bound the wait after a failed publish or
	// store call; it doubles with each failure in a row. Default to 100
	// milliseconds and 10 seconds.
	MinBackoff, MaxBackoff time.Duration
	// Retention is how long sent messages stay in the outbox before
	// cleanup deletes them (for inspection, and so that a late duplicate
	// Add of the same ID is still ignored). Defaults to 24 hours.
	Retention time.Duration
	// CleanupInterval is how often Run deletes sent messages older than
	// Retention, in batches of CleanupBatch. Negative disables cleanup.
	// Defaults to one minute.
	CleanupInterval time.Duration
	// CleanupBatch bounds the rows one cleanup statement deletes. Defaults
	// to 1000.
	CleanupBatch int
	// Logger receives publish and store failures. Defaults to discarding.
	Logger *slog.Logger
	// NowFunc is the clock for claims and cleanup. Defaults to time.Now.
	NowFunc func() time.Time
}

func (c *Config) withDefaults() (Config, error) {
	var r Config
	if c != nil {
		r = *c
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	if r.BatchSize == 0 {
		r.BatchSize = DefaultBatchSize
	}
	if r.CleanupBatch == 0 {
		r.CleanupBatch = DefaultCleanupBatch
	}
	def(&r.Lease, DefaultLease)
	def(&r.PollInterval, DefaultPollInterval)
	def(&r.PublishTimeout, DefaultPublishTimeout)
	def(&r.MinBackoff, DefaultMinBackoff)
	def(&r.MaxBackoff, DefaultMaxBackoff)
	def(&r.Retention, DefaultRetention)
	def(&r.CleanupInterval, DefaultCleanupInterval)
	if r.Logger == nil {
		r.Logger = slog.New(slog.DiscardHandler)
	}
	if r.NowFunc == nil {
		r.NowFunc = time.Now
	}
	switch {
	case r.BatchSize < 0 || r.CleanupBatch < 0:
		return r, errors.New("outbox: BatchSize and CleanupBatch must be positive")
	case r.Lease < 0 || r.PollInterval < 0 || r.PublishTimeout < 0 || r.MinBackoff < 0 || r.MaxBackoff < r.MinBackoff || r.Retention < 0:
		return r, errors.New("outbox: durations must be positive, and MaxBackoff at least MinBackoff")
	case r.PublishTimeout >= r.Lease/2:
		return r, fmt.Errorf("outbox: PublishTimeout (%v) must be under half the Lease (%v)", r.PublishTimeout, r.Lease)
	}
	return r, nil
}

// Dispatcher publishes an outbox's committed messages. Run it in as many
// processes as you like (see the package documentation).
type Dispatcher struct {
	store Store
	pub   Publisher
	cfg   Config
	owner string
	wake  chan struct{}
	retry chan struct{}

	published, failed atomic.Int64
}

// NewDispatcher returns a Dispatcher moving messages from store to pub. It
// starts nothing: call Run.
func NewDispatcher(store Store, pub Publisher, cfg *Config) (*Dispatcher, error) {
	if store == nil || pub == nil {
		return nil, errors.New("outbox: NewDispatcher needs a store and a publisher")
	}
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Dispatcher{store: store, pub: pub, cfg: c, owner: "d_" + rand.Text(), wake: make(chan struct{}, 1),
		retry: make(chan struct{}, 1)}, nil
}

// Notify wakes a waiting Run at once, instead of after PollInterval: call
// it after committing a transaction that added messages. It does not cut
// short a back-off after a failure. It never blocks.
func (d *Dispatcher) Notify() {
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

// RetryNow wakes Run at once, also in the middle of a back-off after a
// failure, and restarts the back-off from its minimum: an operator's
// "retry now" (after Inspector.RetryNow freed a message's claim). It never
// blocks.
func (d *Dispatcher) RetryNow() {
	select {
	case d.retry <- struct{}{}:
	default:
	}
}

// Stats are a Dispatcher's counters since it was created.
type Stats struct {
	// Published counts messages the broker acknowledged.
	Published int64
	// Failed counts publish attempts that failed (and will be retried).
	Failed int64
}

// Stats returns the dispatcher's counters.
func (d *Dispatcher) Stats() Stats {
	return Stats{Published: d.published.Load(), Failed: d.failed.Load()}
}

// Run claims, publishes and marks messages until ctx ends, then returns
// nil. Failures of the broker or the store are logged and retried with
// back-off; they never end Run.
func (d *Dispatcher) Run(ctx context.Context) error {
	backoff := time.Duration(0)
	nextCleanup := d.cfg.NowFunc()
	for ctx.Err() == nil {
		if d.cfg.CleanupInterval > 0 && !d.cfg.NowFunc().Before(nextCleanup) {
			if _, err := d.Cleanup(ctx); err != nil && ctx.Err() == nil {
				d.cfg.Logger.Warn("outbox: cleanup failed", "error", err)
			}
			nextCleanup = d.cfg.NowFunc().Add(d.cfg.CleanupInterval)
		}
		n, err := d.RunOnce(ctx)
		var wait time.Duration
		switch {
		case err != nil:
			backoff = min(max(2*backoff, d.cfg.MinBackoff), d.cfg.MaxBackoff)
			wait = backoff
		case n >= d.cfg.BatchSize:
			backoff = 0
			continue
		default:
			backoff = 0
			wait = d.cfg.PollInterval
		}
		// Notify ends a poll early, never a back-off: a broker that is
		// down is not retried once per request.
		wake := d.wake
		if err != nil {
			wake = nil
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
		case <-t.C:
		case <-wake:
		case <-d.retry:
			backoff = 0
		}
		t.Stop()
	}
	return nil
}

// RunOnce runs one cycle: it claims up to BatchSize messages, publishes
// them (a key's messages one after another), marks the acknowledged ones
// sent and releases the others. It returns how many messages it claimed,
// and an error if the store or the broker failed.
func (d *Dispatcher) RunOnce(ctx context.Context) (int, error) {
	start := d.cfg.NowFunc()
	cctx, cancel := context.WithTimeout(ctx, storeTimeout)
	msgs, err := d.store.Claim(cctx, ClaimParams{Owner: d.owner, Limit: d.cfg.BatchSize, Lease: d.cfg.Lease, Now: start})
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return 0, nil
		}
		d.cfg.Logger.Warn("outbox: claim failed", "error", err)
		return 0, err
	}
	if len(msgs) == 0 {
		return 0, nil
	}
	slices.SortFunc(msgs, func(a, b Message) int { return compareInt(a.Seq, b.Seq) })
	sent, unsent, pubErr := d.publish(ctx, msgs, start)
	d.published.Add(int64(len(sent)))
	// Marking must not be cut short by shutdown: a message published but
	// not marked is published again by the next dispatcher.
	mctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), storeTimeout)
	defer cancel()
	if len(sent) > 0 {
		if err := d.store.MarkSent(mctx, d.owner, sent); err != nil {
			d.cfg.Logger.Warn("outbox: marking messages sent failed; they will be published again after the lease", "messages", len(sent), "error", err)
			return len(msgs), err
		}
	}
	if len(unsent) > 0 {
		if err := d.store.Release(mctx, d.owner, unsent); err != nil {
			d.cfg.Logger.Warn("outbox: releasing messages failed; they wait for the lease", "messages", len(unsent), "error", err)
		}
	}
	if pubErr != nil {
		d.cfg.Logger.Warn("outbox: publish failed; retrying with back-off", "unsent", len(unsent), "error", pubErr)
	}
	return len(msgs), pubErr
}

// publish publishes msgs (sorted by Seq) in rounds: a round holds the next
// message of every key (and every unordered message), so that a key's
// messages go out one after another while different keys go together.
// After a key's message fails, its later messages stay unsent.
func (d *Dispatcher) publish(ctx context.Context, msgs []Message, start time.Time) (sent, unsent []int64, firstErr error) {
	blocked := map[string]bool{}
	pending := msgs
	for len(pending) > 0 {
		var round, next []Message
		inRound := map[string]bool{}
		for _, m := range pending {
			switch {
			case m.Key != "" && blocked[m.Key]:
				unsent = append(unsent, m.Seq)
			case m.Key != "" && inRound[m.Key]:
				next = append(next, m)
			default:
				inRound[m.Key] = m.Key != ""
				round = append(round, m)
			}
		}
		pending = next
		// Stop before the claim could run out under us: another
		// dispatcher may take the messages over after the lease.
		if ctx.Err() != nil || d.cfg.NowFunc().Sub(start) > d.cfg.Lease/2 {
			for _, m := range round {
				unsent = append(unsent, m.Seq)
			}
			continue
		}
		pctx, cancel := context.WithTimeout(ctx, d.cfg.PublishTimeout)
		errs := d.pub.Publish(pctx, round)
		cancel()
		for i, m := range round {
			if errs == nil || errs[i] == nil {
				sent = append(sent, m.Seq)
				continue
			}
			d.failed.Add(1)
			unsent = append(unsent, m.Seq)
			if m.Key != "" {
				blocked[m.Key] = true
			}
			if firstErr == nil {
				firstErr = fmt.Errorf("outbox: publish %s to %s: %w", m.ID, m.Topic, errs[i])
			}
		}
		if firstErr != nil && len(errs) == len(round) && allFailed(errs) {
			// The broker is down: do not wait out a timeout per key.
			for _, m := range pending {
				unsent = append(unsent, m.Seq)
			}
			break
		}
	}
	return sent, unsent, firstErr
}

func allFailed(errs []error) bool {
	for _, err := range errs {
		if err == nil {
			return false
		}
	}
	return true
}

// Cleanup deletes sent messages older than Retention, in batches, and
// returns how many it deleted. Run calls it every CleanupInterval.
func (d *Dispatcher) Cleanup(ctx context.Context) (int, error) {
	before := d.cfg.NowFunc().Add(-d.cfg.Retention)
	total := 0
	for {
		cctx, cancel := context.WithTimeout(ctx, storeTimeout)
		n, err := d.store.DeleteSent(cctx, before, d.cfg.CleanupBatch)
		cancel()
		total += n
		if err != nil {
			return total, err
		}
		if n < d.cfg.CleanupBatch {
			return total, nil
		}
	}
}

func compareInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

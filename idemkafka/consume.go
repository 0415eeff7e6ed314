package idemkafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/idemhq/idem/inbox"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Defaults of ConsumeConfig.
const (
	DefaultRetryDelay     = time.Second
	DefaultMaxPollRecords = 100
	DefaultCommitInterval = time.Second
	// commitTimeout bounds one offset commit.
	commitTimeout = 10 * time.Second
)

// Group is the consumer group Consume runs.
type Group struct {
	// Name is the group id; committed offsets belong to it. Required.
	Name string
	// Topics are the topics the group consumes. Required.
	Topics []string
	// ClientOpts configure the client Consume creates (and closes when it
	// returns): the seed brokers (kgo.SeedBrokers), TLS, SASL, timeouts,
	// the balancers. Consume appends its own options, which replace the
	// same options here: kgo.ConsumerGroup and kgo.ConsumeTopics from
	// this Group, kgo.DisableAutoCommit, the OnPartitionsAssigned,
	// OnPartitionsRevoked and OnPartitionsLost callbacks,
	// kgo.FetchIsolationLevel(kgo.ReadCommitted()), and, with
	// ConsumeConfig.StartFunc, kgo.ConsumeStartOffset.
	ClientOpts []kgo.Opt
}

// ConsumeConfig configures Consume. A nil *ConsumeConfig means all
// defaults.
type ConsumeConfig struct {
	// RetryDelay is how long Consume waits before it handles a record
	// again whose handling failed (inbox.Retry: the handler failed, the
	// store did not answer, or another consumer is handling the same id).
	// Kafka has no per-record negative acknowledgement: the record is
	// retried in place, and the records after it wait. Defaults to one
	// second.
	RetryDelay time.Duration
	// MaxPollRecords bounds the records one poll returns; the offsets of
	// the booked ones are committed after each poll. Defaults to 100.
	MaxPollRecords int
	// CommitInterval is how often offsets are committed while a poll's
	// records are handled (slow handlers). Defaults to one second.
	CommitInterval time.Duration
	// Logger receives handler failures, dropped records, fetch and commit
	// failures. Defaults to discarding.
	Logger *slog.Logger
	// OnHandled, if set, is called after each record is handled (the
	// handler's writes and the inbox record committed, or the id was
	// already handled: ran is false), before its offset is committed.
	OnHandled func(ran bool)
	// OnDropped, if set, is called after a record that can never be
	// handled (inbox.Drop: no usable id, an id reused with another payload,
	// or a handler error wrapping inbox.ErrUnprocessable) was skipped, with
	// the reason; Consume has logged it. Its offset is committed like a
	// handled record's: Kafka has no dead-letter queue of its own, so
	// produce the record to one here if it must be kept.
	OnDropped func(m inbox.Message, err error)
	// StartFunc, if set, is called once when Consume starts; it returns
	// the time of the oldest record to read on a partition for which the
	// group has no committed offset (a new group, a group whose offsets
	// expired or were deleted, a topic deleted and created again), or the
	// zero time for the start of the partition. Offsets of a group are
	// lost only while it has no members (Kafka expires them after
	// offsets.retention.minutes, 7 days by default, of an empty group; a
	// group is deleted only when empty), so asking at start is enough. A
	// consumer that has handled records before starts at its
	// deduplication window this way, instead of reading again records
	// whose inbox records have expired. Defaults to the start of each
	// partition.
	StartFunc func(ctx context.Context) (time.Time, error)

	hooks *testHooks
}

// testHooks let the package's tests stop a consumer at a chosen point as
// a crash would, and break the commit order on purpose. Only
// export_test.go sets them.
type testHooks struct {
	// beforeProcess and afterProcess return true to crash: Consume
	// returns errCrashed without committing anything more.
	beforeProcess func(m inbox.Message) bool
	afterProcess  func(m inbox.Message) bool
	// commitFirst commits a record's offset before handling it: the
	// wrong order, which loses the record in a crash.
	commitFirst bool
}

// errCrashed is returned by Consume after a test hook crashed it.
var errCrashed = errors.New("idemkafka: crashed by a test hook")

// Consume runs the consumer group g, handling each record through in with
// h, until ctx ends; it then commits what it booked, leaves the group and
// returns nil. It returns an error when the arguments are invalid,
// StartFunc fails, or the client cannot be created.
//
// A record's message id is its MessageIDHeader header, or, for a record
// produced without one, "kafka:TOPIC:PARTITION:OFFSET" (stable across
// re-reads of that stored record, but reused if the topic is deleted and
// created again).
//
// Records are handled one at a time, in order per partition. A record's
// offset is committed only after Inbox.Process answered Ack (handled now
// or before) or Drop (can never be handled: logged, skipped, and passed
// to ConsumeConfig.OnDropped); on Retry the record is handled again after
// RetryDelay. Offsets are committed after each poll, every
// CommitInterval during a long one, when partitions are revoked (what was
// booked on them, and nothing beyond), and when Consume returns. A
// partition revoked while its records are being handled is not handled
// further; the next owner reads from the committed offset, and the inbox
// acknowledges the records booked since as replays.
//
// The client rejoins the group on its own after a broker restart, a
// coordinator move or a session loss, and consumes a topic deleted and
// created again from its start (or StartFunc's time); nothing has to be
// re-created by hand.
func Consume(ctx context.Context, g Group, in *inbox.Inbox, h inbox.Handler, cfg *ConsumeConfig) error {
	if g.Name == "" || len(g.Topics) == 0 {
		return errors.New("idemkafka: Consume needs a group name and at least one topic")
	}
	if in == nil || h == nil {
		return errors.New("idemkafka: Consume needs an inbox and a handler")
	}
	var c ConsumeConfig
	if cfg != nil {
		c = *cfg
	}
	if c.RetryDelay == 0 {
		c.RetryDelay = DefaultRetryDelay
	}
	if c.MaxPollRecords == 0 {
		c.MaxPollRecords = DefaultMaxPollRecords
	}
	if c.CommitInterval == 0 {
		c.CommitInterval = DefaultCommitInterval
	}
	if c.RetryDelay < 0 || c.MaxPollRecords < 0 || c.CommitInterval < 0 {
		return errors.New("idemkafka: RetryDelay, MaxPollRecords and CommitInterval must be positive")
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.hooks == nil {
		c.hooks = &testHooks{}
	}
	s := &session{in: in, h: h, c: &c, owned: map[tp]uint64{}, booked: map[tp]kgo.EpochOffset{}, committed: map[tp]kgo.EpochOffset{}}
	opts := slices.Clone(g.ClientOpts)
	opts = append(opts,
		kgo.ConsumerGroup(g.Name),
		kgo.ConsumeTopics(g.Topics...),
		kgo.DisableAutoCommit(),
		kgo.OnPartitionsAssigned(s.assigned),
		kgo.OnPartitionsRevoked(s.revoked),
		kgo.OnPartitionsLost(s.lost),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
	)
	if c.StartFunc != nil {
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		start, err := c.StartFunc(sctx)
		cancel()
		if err != nil {
			return fmt.Errorf("idemkafka: consume: where to start: %w", err)
		}
		if !start.IsZero() {
			opts = append(opts, kgo.ConsumeStartOffset(kgo.NewOffset().AfterMilli(start.UnixMilli())))
		}
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return fmt.Errorf("idemkafka: consume: %w", err)
	}
	s.cl = cl
	err = s.run(ctx)
	if !errors.Is(err, errCrashed) {
		s.commit() // what the last poll booked
	}
	// Leaving the group revokes every partition: s.revoked commits what
	// is left, unless crashed.
	cl.Close()
	return err
}

// tp is a topic partition.
type tp struct {
	topic     string
	partition int32
}

// session is one Consume's state. The loop (run) handles records and
// commits; the client's group goroutine calls assigned, revoked and lost
// concurrently with it.
type session struct {
	cl *kgo.Client
	in *inbox.Inbox
	h  inbox.Handler
	c  *ConsumeConfig

	// commitMu serialises commits: a revoke's commit waits for the loop's
	// commit in flight, so that the loop never commits a partition after
	// its revoke returned.
	commitMu   sync.Mutex
	lastCommit time.Time // the loop's only

	mu sync.Mutex
	// owned holds the partitions assigned to this member, each with a
	// token that changes with every assignment: a record is booked and
	// committed only under the token its partition had when the loop
	// started on it.
	owned map[tp]uint64
	next  uint64
	// booked holds, per owned partition, the offset after the last
	// record handled (the offset to commit); committed what the last
	// successful commit stored.
	booked, committed map[tp]kgo.EpochOffset
	crashed           bool
}

func (s *session) assigned(_ context.Context, _ *kgo.Client, assigned map[string][]int32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for topic, ps := range assigned {
		for _, p := range ps {
			s.next++
			k := tp{topic, p}
			s.owned[k] = s.next
			delete(s.booked, k)
			delete(s.committed, k)
		}
	}
}

// revoked commits what was booked on the revoked partitions, and stops
// their handling: the rebalance goes on when it returns.
func (s *session) revoked(_ context.Context, _ *kgo.Client, revoked map[string][]int32) {
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	s.mu.Lock()
	due := map[tp]kgo.EpochOffset{}
	for topic, ps := range revoked {
		for _, p := range ps {
			k := tp{topic, p}
			if o, ok := s.booked[k]; ok && o != s.committed[k] {
				due[k] = o
			}
			delete(s.owned, k)
			delete(s.booked, k)
			delete(s.committed, k)
		}
	}
	crashed := s.crashed
	s.mu.Unlock()
	if crashed || len(due) == 0 {
		return
	}
	if err := s.commitOffsets(due); err != nil {
		s.c.Logger.Warn("idemkafka: committing the offsets of revoked partitions failed; their next owner reads the booked records again (replays)", "error", err)
	}
}

// lost stops the handling of partitions taken away without a revoke (the
// member was fenced or its session expired): a commit would be refused,
// so none is tried.
func (s *session) lost(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for topic, ps := range lost {
		for _, p := range ps {
			k := tp{topic, p}
			delete(s.owned, k)
			delete(s.booked, k)
			delete(s.committed, k)
		}
	}
}

// consumeAnew starts consuming topic anew after it was deleted (and
// perhaps created again under a new topic id, which the client never
// adopts by itself: its fetches fail with UNKNOWN_TOPIC_ID). What was
// booked on the old topic and not committed is forgotten: its offsets
// belong to the old topic (Kafka dropped the group's offsets with it), and
// a commit under the topic's name would skip records of the new one. The
// client then reads the new topic from its start (or StartFunc's time).
func (s *session) consumeAnew(topic string) {
	s.mu.Lock()
	for k := range s.owned {
		if k.topic == topic {
			delete(s.owned, k)
			delete(s.booked, k)
			delete(s.committed, k)
		}
	}
	s.mu.Unlock()
	s.c.Logger.Warn("idemkafka: the topic was deleted (and maybe created again); consuming it anew", "topic", topic)
	s.cl.PurgeTopicsFromConsuming(topic)
	s.cl.AddConsumeTopics(topic)
}

// token returns k's assignment token, and whether k is owned.
func (s *session) token(k tp) (uint64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.owned[k]
	return t, ok
}

// mark records that r was handled, if its partition is still owned under
// tok, and reports whether it is.
func (s *session) mark(k tp, tok uint64, r *kgo.Record) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if t, ok := s.owned[k]; !ok || t != tok {
		return false
	}
	s.booked[k] = kgo.EpochOffset{Epoch: r.LeaderEpoch, Offset: r.Offset + 1}
	return true
}

func (s *session) crash() {
	s.mu.Lock()
	s.crashed = true
	s.mu.Unlock()
}

// run polls and handles records until ctx ends (nil), the client is closed,
// or a test hook crashed it (errCrashed).
func (s *session) run(ctx context.Context) error {
	s.lastCommit = time.Now()
	for {
		fs := s.cl.PollRecords(ctx, s.c.MaxPollRecords)
		if ctx.Err() != nil {
			return nil
		}
		if fs.IsClientClosed() { // only Consume closes it: not expected
			return errors.New("idemkafka: consume: the client was closed")
		}
		failed := false
		var recreated []string
		fs.EachError(func(topic string, partition int32, err error) {
			failed = true
			if errors.Is(err, kerr.UnknownTopicID) && !slices.Contains(recreated, topic) {
				recreated = append(recreated, topic)
			}
			s.c.Logger.Warn("idemkafka: fetching failed", "topic", topic, "partition", partition, "error", err)
		})
		crashed := false
		fs.EachPartition(func(p kgo.FetchTopicPartition) {
			if !crashed && ctx.Err() == nil {
				crashed = !s.partition(ctx, p)
			}
		})
		if crashed {
			return errCrashed
		}
		s.commit()
		for _, topic := range recreated {
			s.consumeAnew(topic)
		}
		// A no-op unless ClientOpts has kgo.BlockRebalanceOnPoll.
		s.cl.AllowRebalance()
		if failed && fs.NumRecords() == 0 && !sleep(ctx, 250*time.Millisecond) {
			return nil
		}
	}
}

// partition handles p's records in order. It returns false after a test
// hook crashed the consumer.
func (s *session) partition(ctx context.Context, p kgo.FetchTopicPartition) bool {
	k := tp{p.Topic, p.Partition}
	tok, ok := s.token(k)
	if !ok {
		return true // revoked since the poll
	}
	for _, r := range p.Records {
		switch s.handle(ctx, k, tok, r) {
		case stopPartition:
			return true
		case stopCrashed:
			return false
		}
		if time.Since(s.lastCommit) >= s.c.CommitInterval {
			s.commit()
		}
	}
	return true
}

// outcome is what handle tells partition to do next.
type outcome int

const (
	next          outcome = iota // the record is done: go on
	stopPartition                // revoked, or ctx ended: stop this partition
	stopCrashed                  // a test hook crashed the consumer
)

// handle processes r through the inbox until it is handled or dropped,
// retrying it in place after RetryDelay.
func (s *session) handle(ctx context.Context, k tp, tok uint64, r *kgo.Record) outcome {
	m := Message(r)
	hk := s.c.hooks
	if hk.commitFirst && s.mark(k, tok, r) {
		s.commit()
	}
	for {
		if t, ok := s.token(k); !ok || t != tok || ctx.Err() != nil {
			return stopPartition
		}
		if hk.beforeProcess != nil && hk.beforeProcess(m) {
			s.crash()
			return stopCrashed
		}
		action, replayed, err := s.in.Process(ctx, m, s.h)
		if hk.afterProcess != nil && hk.afterProcess(m) {
			s.crash()
			return stopCrashed
		}
		switch action {
		case inbox.Ack:
			if s.c.OnHandled != nil {
				s.c.OnHandled(!replayed)
			}
			if !s.mark(k, tok, r) {
				return stopPartition
			}
			return next
		case inbox.Drop:
			s.c.Logger.Error("idemkafka: skipping a record that can never be handled", "topic", r.Topic,
				"partition", r.Partition, "offset", r.Offset, "message_id", loggedID(m.ID), "error", err)
			if s.c.OnDropped != nil {
				s.c.OnDropped(m, err)
			}
			if !s.mark(k, tok, r) {
				return stopPartition
			}
			return next
		}
		if ctx.Err() != nil {
			return stopPartition
		}
		s.c.Logger.Warn("idemkafka: handling failed; retrying the record", "topic", r.Topic, "partition", r.Partition,
			"offset", r.Offset, "message_id", loggedID(m.ID), "error", err, "in", s.c.RetryDelay)
		if !sleep(ctx, s.c.RetryDelay) {
			return stopPartition
		}
	}
}

// commit commits the booked offsets of the owned partitions that changed
// since the last commit. It is not cut short by the end of Consume's
// context (a booked offset left uncommitted is read again), and is bounded
// by commitTimeout.
func (s *session) commit() {
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	s.lastCommit = time.Now()
	s.mu.Lock()
	if s.crashed {
		s.mu.Unlock()
		return
	}
	due := map[tp]kgo.EpochOffset{}
	tokens := map[tp]uint64{}
	for k, o := range s.booked {
		if o != s.committed[k] {
			due[k], tokens[k] = o, s.owned[k]
		}
	}
	s.mu.Unlock()
	if len(due) == 0 {
		return
	}
	if err := s.commitOffsets(due); err != nil {
		s.c.Logger.Warn("idemkafka: committing offsets failed; retrying with the next commit", "error", err)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, o := range due {
		if t, ok := s.owned[k]; ok && t == tokens[k] {
			s.committed[k] = o
		}
	}
}

// commitOffsets commits offs synchronously, bounded by commitTimeout, and
// returns the first refusal.
func (s *session) commitOffsets(offs map[tp]kgo.EpochOffset) error {
	m := map[string]map[int32]kgo.EpochOffset{}
	for k, o := range offs {
		if m[k.topic] == nil {
			m[k.topic] = map[int32]kgo.EpochOffset{}
		}
		m[k.topic][k.partition] = o
	}
	ctx, cancel := context.WithTimeout(context.Background(), commitTimeout)
	defer cancel()
	var cerr error
	s.cl.CommitOffsetsSync(ctx, m, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
		if err != nil {
			cerr = err
			return
		}
		for _, t := range resp.Topics {
			for _, p := range t.Partitions {
				if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
					cerr = errors.Join(cerr, fmt.Errorf("%s/%d: %w", t.Topic, p.Partition, err))
				}
			}
		}
	})
	return cerr
}

// Message returns the inbox message Consume hands to the inbox for r: the
// id from the MessageIDHeader header (or "kafka:TOPIC:PARTITION:OFFSET"
// without one), the topic, the value, and the headers (the first value of
// each name).
func Message(r *kgo.Record) inbox.Message {
	m := inbox.Message{Topic: r.Topic, Payload: r.Value}
	if len(r.Headers) > 0 {
		m.Headers = make(map[string]string, len(r.Headers))
		for _, h := range r.Headers {
			if _, dup := m.Headers[h.Key]; !dup {
				m.Headers[h.Key] = string(h.Value)
			}
		}
	}
	m.ID = m.Headers[MessageIDHeader]
	if m.ID == "" {
		m.ID = "kafka:" + r.Topic + ":" + strconv.FormatInt(int64(r.Partition), 10) + ":" + strconv.FormatInt(r.Offset, 10)
	}
	return m
}

// maxLoggedID bounds a message id in logs: ids come from producers.
const maxLoggedID = 120

// loggedID is a message id as logs show it, cut to maxLoggedID bytes
// (slog quotes or escapes any control character).
func loggedID(id string) string {
	if len(id) > maxLoggedID {
		return id[:maxLoggedID] + "..."
	}
	return id
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

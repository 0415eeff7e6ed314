package idemkafka

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/idemhq/idem/outbox"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// MessageIDHeader is the record header that carries the outbox message id:
// the id consumers deduplicate on, stable across re-publications of one
// message. Kafka has no message id of its own; the name follows JetStream's
// Nats-Msg-Id.
const MessageIDHeader = "Idem-Msg-Id"

// Publisher publishes outbox messages to Kafka. It is safe for concurrent
// use.
type Publisher struct {
	cl *kgo.Client
}

var _ outbox.Publisher = (*Publisher)(nil)

// NewPublisher returns a Publisher on cl, which the caller owns (and
// closes). cl must be an idempotent producer with acks=all, franz-go's
// defaults: NewPublisher returns an error for a client created with
// kgo.DisableIdempotentWrite, another kgo.RequiredAcks, or a
// kgo.TransactionalID (the publisher does not begin transactions).
//
// Keep cl's partitioner one that hashes record keys (franz-go's default,
// or kgo.StickyKeyPartitioner): the per-key order depends on it. Give cl a
// kgo.RecordDeliveryTimeout (30 seconds, say), so that records buffered
// while the brokers are unreachable are failed, not kept until they come
// back; a record already sent is not failed before the broker answered, as
// the idempotent producer requires. kgo.ProducerBatchMaxBytes (1,000,012
// bytes by default) and the topic's max.message.bytes bound a message:
// raise both to outbox.DefaultMaxPayload plus headers if payloads come
// near it, or a message that large fails on every attempt.
func NewPublisher(cl *kgo.Client) (*Publisher, error) {
	if cl == nil {
		return nil, errors.New("idemkafka: NewPublisher needs a client")
	}
	if idem, _ := cl.OptValue(kgo.DisableIdempotentWrite).(bool); idem {
		return nil, errors.New("idemkafka: the client must be an idempotent producer (no kgo.DisableIdempotentWrite)")
	}
	if acks, _ := cl.OptValue(kgo.RequiredAcks).(kgo.Acks); acks != kgo.AllISRAcks() {
		return nil, errors.New("idemkafka: the client must require acks from all in-sync replicas (kgo.AllISRAcks)")
	}
	if txid, _ := cl.OptValue(kgo.TransactionalID).(string); txid != "" {
		return nil, errors.New("idemkafka: the client must not be transactional (kgo.TransactionalID)")
	}
	return &Publisher{cl: cl}, nil
}

// Publish implements outbox.Publisher: it produces one record per message,
// in order, and waits for the broker's acknowledgement of each until ctx
// ends. A message whose record was not acknowledged by then is reported
// failed; its record may still be stored later (the client does not cancel
// a request already sent), which makes a copy that the consumer's inbox
// drops.
func (p *Publisher) Publish(ctx context.Context, msgs []outbox.Message) []error {
	type result struct {
		i   int
		err error
	}
	// Buffered for every promise, so that promises never block the
	// client, even after Publish returned.
	done := make(chan result, len(msgs))
	for i, m := range msgs {
		// ctx also cancels records still buffered when it ends.
		p.cl.Produce(ctx, Record(m), func(_ *kgo.Record, err error) { done <- result{i, err} })
	}
	errs := make([]error, len(msgs))
	acked := make([]bool, len(msgs))
	failed := false
	// A topic deleted and created again has a new topic id, which the
	// client never adopts by itself: its records fail with
	// UNKNOWN_TOPIC_ID until the topic is purged from the client, and
	// the next Publish then produces to the new topic.
	var recreated []string
	defer func() { p.purge(recreated) }()
	for range msgs {
		select {
		case r := <-done:
			acked[r.i] = true
			if r.err != nil {
				errs[r.i], failed = fmt.Errorf("idemkafka: produce: %w", r.err), true
				if errors.Is(r.err, kerr.UnknownTopicID) && !slices.Contains(recreated, msgs[r.i].Topic) {
					recreated = append(recreated, msgs[r.i].Topic)
				}
			}
		case <-ctx.Done():
			err := fmt.Errorf("idemkafka: no acknowledgement: %w", context.Cause(ctx))
			for i := range msgs {
				if !acked[i] {
					errs[i] = err
				}
			}
			return errs
		}
	}
	if !failed {
		return nil
	}
	return errs
}

// purge forgets what the client knows of topics, so that it looks them up
// again.
func (p *Publisher) purge(topics []string) {
	if len(topics) > 0 {
		p.cl.PurgeTopicsFromProducing(topics...)
	}
}

// Record returns the record Publisher produces for m: topic m.Topic, key
// m.Key (none when empty), value m.Payload, the header MessageIDHeader with
// m.ID, then m.Headers sorted by name. A header of m.Headers named
// MessageIDHeader is left out: the id header is the publisher's.
func Record(m outbox.Message) *kgo.Record {
	r := &kgo.Record{Topic: m.Topic, Value: m.Payload}
	if m.Key != "" {
		r.Key = []byte(m.Key)
	}
	r.Headers = make([]kgo.RecordHeader, 0, 1+len(m.Headers))
	r.Headers = append(r.Headers, kgo.RecordHeader{Key: MessageIDHeader, Value: []byte(m.ID)})
	names := make([]string, 0, len(m.Headers))
	for k := range m.Headers {
		if k != MessageIDHeader {
			names = append(names, k)
		}
	}
	slices.Sort(names)
	for _, k := range names {
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: k, Value: []byte(m.Headers[k])})
	}
	return r
}

// TopicConfig configures EnsureTopic. A nil *TopicConfig means all
// defaults.
type TopicConfig struct {
	// Partitions is the number of partitions of a topic EnsureTopic
	// creates. More partitions let more consumers of a group work in
	// parallel; a key's messages stay on one. Adding partitions later
	// moves keys to other partitions, so that a key's records written
	// before and after are no longer ordered. Defaults to the broker's
	// num.partitions.
	Partitions int32
	// ReplicationFactor is the number of replicas of each partition.
	// Defaults to the broker's default.replication.factor.
	ReplicationFactor int16
	// Configs are topic configs (retention.ms, min.insync.replicas, ...)
	// of a topic EnsureTopic creates. Optional.
	Configs map[string]string
}

// EnsureTopic creates topic when it does not exist (with cfg), and returns
// whether it created it. An existing topic is used as it is.
func EnsureTopic(ctx context.Context, cl *kgo.Client, topic string, cfg *TopicConfig) (created bool, err error) {
	var c TopicConfig
	if cfg != nil {
		c = *cfg
	}
	t := kmsg.NewCreateTopicsRequestTopic()
	t.Topic = topic
	t.NumPartitions, t.ReplicationFactor = -1, -1
	if c.Partitions > 0 {
		t.NumPartitions = c.Partitions
	}
	if c.ReplicationFactor > 0 {
		t.ReplicationFactor = c.ReplicationFactor
	}
	names := make([]string, 0, len(c.Configs))
	for k := range c.Configs {
		names = append(names, k)
	}
	slices.Sort(names)
	for _, k := range names {
		tc := kmsg.NewCreateTopicsRequestTopicConfig()
		tc.Name, tc.Value = k, kmsg.StringPtr(c.Configs[k])
		t.Configs = append(t.Configs, tc)
	}
	req := kmsg.NewPtrCreateTopicsRequest()
	req.Topics = []kmsg.CreateTopicsRequestTopic{t}
	req.TimeoutMillis = 10_000
	if d, ok := ctx.Deadline(); ok {
		req.TimeoutMillis = int32(min(max(time.Until(d).Milliseconds(), 1), 10_000))
	}
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return false, fmt.Errorf("idemkafka: create topic %s: %w", topic, err)
	}
	if len(resp.Topics) != 1 {
		return false, fmt.Errorf("idemkafka: create topic %s: %d topics in the answer", topic, len(resp.Topics))
	}
	switch err := kerr.ErrorForCode(resp.Topics[0].ErrorCode); {
	case err == nil:
		return true, nil
	case errors.Is(err, kerr.TopicAlreadyExists):
		return false, nil
	default:
		msg := ""
		if m := resp.Topics[0].ErrorMessage; m != nil {
			msg = ": " + *m
		}
		return false, fmt.Errorf("idemkafka: create topic %s: %w%s", topic, err, msg)
	}
}

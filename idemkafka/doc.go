// Package idemkafka connects idem's outbox and inbox to Apache Kafka
// (github.com/twmb/franz-go).
//
// # Publishing
//
// Publisher is an outbox.Publisher on a *kgo.Client the caller owns. It
// requires an idempotent producer with acks=all (franz-go's defaults), so
// that a batch the client retries is stored once and only after every
// in-sync replica has it. Each message becomes one record:
//
//   - the record key is Message.Key, so that a key's messages land on one
//     partition, where Kafka keeps their order; a message with an empty Key
//     gets no record key and may land on any partition (unordered);
//   - the message id is the record header [MessageIDHeader]
//     ("Idem-Msg-Id"), the deduplication key consumers use, as JetStream
//     uses Nats-Msg-Id;
//   - Message.Headers become record headers.
//
// A message is reported sent only when the broker acknowledged its record.
// Kafka does not deduplicate records across producer sessions: a message a
// dispatcher publishes again after a crash is stored twice, with the same
// Idem-Msg-Id, and the consumer's inbox drops the copy.
//
// # Consuming
//
// Consume runs a consumer group and feeds its records to an inbox.Inbox. It
// commits a partition's offset only past records whose handler writes and
// inbox record have committed (manual commits; at least once): a consumer
// that dies before a commit leaves its records to be read again, and the
// inbox acknowledges them as replays without running the handler. When a
// rebalance takes partitions away, Consume commits what it booked on them
// and nothing beyond, and stops handling their records.
//
// # Testing
//
// The tests run against franz-go's in-process cluster
// (github.com/twmb/franz-go/pkg/kfake), which speaks the Kafka protocol on
// real TCP ports. They do not prove how a real Kafka cluster behaves under
// replication, leader elections, retention or group coordination across
// brokers.
package idemkafka

package events

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/idemhq/idem/idemkafka"
	"github.com/idemhq/idem/inbox"
	"github.com/twmb/franz-go/pkg/kgo"
)

// KafkaForm is the --events form for Kafka, as errors show it.
const KafkaForm = "kafka://HOST:PORT[,HOST:PORT...][?topic=T&partitions=N&replication=N&group=G&tls=true]"

// Bounds of a kafka:// URL.
const (
	maxKafkaURL     = 2048
	maxKafkaBrokers = 64
	// kafkaSessionTimeout is the consumer's group session: a consume
	// process killed without leaving the group keeps its partitions
	// this long. Kafka's default (45 seconds) would stop booking for that
	// long after every crash; brokers accept 6 seconds and up.
	kafkaSessionTimeout = 10 * time.Second
	// kafkaRebalanceTimeout bounds a rebalance: how long the group waits
	// for its members to rejoin (kfake removes a killed member only after
	// it). consume's revoke is one offset commit (at most 10 seconds), and
	// its handling never holds a rebalance up, so it needs far less than
	// the 60-second default.
	kafkaRebalanceTimeout = 15 * time.Second
)

// KafkaConfig is a parsed kafka:// URL.
type KafkaConfig struct {
	// Brokers are the seed brokers, host:port (port 9092 when the URL
	// names none).
	Brokers []string
	// Topic is the topic (the "topic" parameter); empty means the
	// --events-subject.
	Topic string
	// Partitions and ReplicationFactor are those of a topic serve or
	// consume creates ("partitions", "replication"); zero means the
	// broker's defaults.
	Partitions        int32
	ReplicationFactor int16
	// Group is consume's consumer group ("group"); empty means the topic.
	Group string
	// TLS connects with TLS, verified against the system's roots ("tls").
	TLS bool
}

// ParseKafkaURL parses an --events URL of the form KafkaForm. A URL with
// credentials is refused: the demo has no SASL.
func ParseKafkaURL(raw string) (KafkaConfig, error) {
	var c KafkaConfig
	bad := func(why string, args ...any) (KafkaConfig, error) {
		return KafkaConfig{}, fmt.Errorf("--events %s: %s; the form is %s", redactKafka(raw), fmt.Sprintf(why, args...), KafkaForm)
	}
	if len(raw) > maxKafkaURL {
		return bad("longer than %d bytes", maxKafkaURL)
	}
	rest, ok := strings.CutPrefix(raw, "kafka://")
	if !ok {
		return bad("not a kafka:// URL")
	}
	hosts, query, _ := strings.Cut(rest, "?")
	if strings.Contains(query, "#") || strings.Contains(hosts, "#") {
		return bad("a fragment (#) has no meaning here")
	}
	hosts = strings.TrimSuffix(hosts, "/")
	switch {
	case strings.Contains(hosts, "@"):
		return bad("credentials are not supported (no SASL)")
	case strings.Contains(hosts, "/"):
		return bad("no path after the brokers")
	case hosts == "":
		return bad("no broker")
	}
	for _, h := range strings.Split(hosts, ",") {
		if len(c.Brokers) == maxKafkaBrokers {
			return bad("more than %d brokers", maxKafkaBrokers)
		}
		hp, err := kafkaHostPort(h)
		if err != nil {
			return bad("broker %q: %v", h, err)
		}
		c.Brokers = append(c.Brokers, hp)
	}
	q, err := url.ParseQuery(query)
	if err != nil {
		return bad("the query: %v", err)
	}
	for k, vs := range q {
		if len(vs) != 1 {
			return bad("parameter %q given %d times", k, len(vs))
		}
		v := vs[0]
		switch k {
		case "topic":
			if err := ValidateSubject(v); err != nil {
				return bad("topic %q: use 1 to 200 letters, digits, '-' and '_' between dots", v)
			}
			c.Topic = v
		case "partitions":
			n, err := strconv.ParseInt(v, 10, 32)
			if err != nil || n < 1 || n > 10_000 {
				return bad("partitions must be 1 to 10000, not %q", v)
			}
			c.Partitions = int32(n)
		case "replication":
			n, err := strconv.ParseInt(v, 10, 16)
			if err != nil || n < 1 {
				return bad("replication must be 1 to 32767, not %q", v)
			}
			c.ReplicationFactor = int16(n)
		case "group":
			if v == "" || len(v) > 200 || !printableASCII(v) {
				return bad("group must be 1 to 200 printable ASCII characters")
			}
			c.Group = v
		case "tls":
			b, err := strconv.ParseBool(v)
			if err != nil {
				return bad("tls must be true or false, not %q", v)
			}
			c.TLS = b
		default:
			return bad("unknown parameter %q (known: topic, partitions, replication, group, tls)", k)
		}
	}
	return c, nil
}

// kafkaHostPort checks one broker address and adds the default port.
func kafkaHostPort(h string) (string, error) {
	if h == "" {
		return "", errors.New("empty")
	}
	if !strings.Contains(h, ":") || strings.HasPrefix(h, "[") && strings.HasSuffix(h, "]") {
		h += ":9092"
	}
	host, port, err := net.SplitHostPort(h)
	if err != nil {
		return "", err
	}
	if host == "" || !printableASCII(host) || strings.ContainsAny(host, "%?&=") {
		return "", errors.New("not a host name or address")
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return "", fmt.Errorf("port %q is not 1 to 65535", port)
	}
	return net.JoinHostPort(host, port), nil
}

func printableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c > '~' {
			return false
		}
	}
	return true
}

// redactKafka shows a kafka:// URL in an error without what could be a
// password, and bounded.
func redactKafka(raw string) string {
	if i := strings.LastIndex(raw, "@"); i >= 0 {
		raw = "kafka://xxxxx" + raw[i:]
	}
	if len(raw) > 200 {
		raw = raw[:200] + "..."
	}
	return strconv.Quote(raw)
}

// kafkaOpts are the client options for c.
func kafkaOpts(c KafkaConfig) []kgo.Opt {
	opts := []kgo.Opt{
		kgo.SeedBrokers(c.Brokers...),
		kgo.ClientID("idem"),
		kgo.DialTimeout(5 * time.Second),
		// Records buffered while the brokers are unreachable fail
		// instead of waiting for them; the outbox keeps the events.
		kgo.RecordDeliveryTimeout(30 * time.Second),
	}
	if c.TLS {
		opts = append(opts, kgo.DialTLSConfig(&tls.Config{MinVersion: tls.VersionTLS12}))
	}
	return opts
}

func dialKafka(rawURL, subject string, logger *slog.Logger) (*Conn, error) {
	c, err := ParseKafkaURL(rawURL)
	if err != nil {
		return nil, err
	}
	topic := subject
	if c.Topic != "" {
		topic = c.Topic
	}
	group := topic
	if c.Group != "" {
		group = c.Group
	}
	// The client connects when it is first used: serve starts (and
	// takes payments) while the brokers are down.
	cl, err := kgo.NewClient(kafkaOpts(c)...)
	if err != nil {
		return nil, fmt.Errorf("events: %w", err)
	}
	pub, err := idemkafka.NewPublisher(cl)
	if err != nil {
		cl.Close()
		return nil, err
	}
	tc := &idemkafka.TopicConfig{Partitions: c.Partitions, ReplicationFactor: c.ReplicationFactor}
	ensure := func(ctx context.Context) error {
		created, err := idemkafka.EnsureTopic(ctx, cl, topic, tc)
		if created {
			logger.Info("events: created the Kafka topic", "topic", topic)
		}
		return err
	}
	return &Conn{
		Where:     strings.Join(c.Brokers, ","),
		Topic:     topic,
		Publisher: &ensuring{ensure: ensure, pub: pub},
		close:     cl.Close,
		consume: func(ctx context.Context, in *inbox.Inbox, h inbox.Handler, cfg *ConsumeConfig) error {
			// The topic is created here too, so that consume can start
			// first; a broker that is down is waited for.
			for {
				cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				err := ensure(cctx)
				cancel()
				if err == nil {
					break
				}
				logger.Warn("events: cannot create the Kafka topic yet; retrying", "topic", topic, "error", err)
				if !sleep(ctx, time.Second) {
					return nil
				}
			}
			opts := append(kafkaOpts(c), kgo.SessionTimeout(kafkaSessionTimeout),
				kgo.RebalanceTimeout(kafkaRebalanceTimeout), kgo.HeartbeatInterval(time.Second))
			return idemkafka.Consume(ctx, idemkafka.Group{Name: group, Topics: []string{topic}, ClientOpts: opts}, in, h,
				&idemkafka.ConsumeConfig{Logger: logger, OnHandled: cfg.OnHandled, OnDropped: cfg.OnDropped, StartFunc: cfg.StartFunc})
		},
	}, nil
}

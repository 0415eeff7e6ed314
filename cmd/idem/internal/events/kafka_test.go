package events

import (
	"slices"
	"strings"
	"testing"
)

func TestParseKafkaURL(t *testing.T) {
	t.Parallel()
	for raw, want := range map[string]KafkaConfig{
		"kafka://127.0.0.1:9092":           {Brokers: []string{"127.0.0.1:9092"}},
		"kafka://h":                        {Brokers: []string{"h:9092"}},
		"kafka://a:1,b:2/":                 {Brokers: []string{"a:1", "b:2"}},
		"kafka://[::1]:9093,[::1]":         {Brokers: []string{"[::1]:9093", "[::1]:9092"}},
		"kafka://h:9092?topic=x.y&group=g": {Brokers: []string{"h:9092"}, Topic: "x.y", Group: "g"},
		"kafka://h:9092/?partitions=6&replication=3&tls=true": {Brokers: []string{"h:9092"}, Partitions: 6, ReplicationFactor: 3, TLS: true},
	} {
		got, err := ParseKafkaURL(raw)
		if err != nil || !slices.Equal(got.Brokers, want.Brokers) || got.Topic != want.Topic || got.Group != want.Group ||
			got.Partitions != want.Partitions || got.ReplicationFactor != want.ReplicationFactor || got.TLS != want.TLS {
			t.Errorf("ParseKafkaURL(%q) = %+v, %v; want %+v", raw, got, err, want)
		}
	}
	for raw, why := range map[string]string{
		"kafka://":                             "no broker",
		"kafka://h:0":                          "port",
		"kafka://h:99999":                      "port",
		"kafka://h:x":                          "port",
		"kafka://a:1,,b:2":                     "empty",
		"kafka://:9092":                        "host",
		"kafka://user:secret@h:9092":           "credentials",
		"kafka://h:9092/path":                  "path",
		"kafka://h:9092?topic=a..b":            "topic",
		"kafka://h:9092?topic=a&topic=b":       "2 times",
		"kafka://h:9092?partitions=0":          "partitions",
		"kafka://h:9092?replication=-1":        "replication",
		"kafka://h:9092?group=":                "group",
		"kafka://h:9092?tls=maybe":             "tls",
		"kafka://h:9092?acks=1":                "unknown parameter",
		"kafka://h:9092?%zz":                   "query",
		"kafka://h:9092#frag":                  "fragment",
		"kafka://" + strings.Repeat("a", 3000): "longer",
	} {
		_, err := ParseKafkaURL(raw)
		if err == nil || !strings.Contains(err.Error(), why) || !strings.Contains(err.Error(), KafkaForm) {
			t.Errorf("ParseKafkaURL(%q): %v; want an error about %q naming the form", raw, err, why)
		}
		if err != nil && strings.Contains(err.Error(), "secret") {
			t.Errorf("ParseKafkaURL(%q): the error shows the password: %v", raw, err)
		}
	}
}

// FuzzParseKafkaURL: an accepted URL has 1 to 64 brokers, each a host and
// a port 1 to 65535 that parse again to themselves, and a valid topic.
func FuzzParseKafkaURL(f *testing.F) {
	for _, s := range []string{"kafka://127.0.0.1:9092", "kafka://a:1,b:2/?topic=x&group=g&partitions=3&replication=1&tls=false",
		"kafka://[::1]", "kafka://h:9092?topic=a..b", "kafka://u:p@h", "kafka://h:9092?%", "kafka://,", "nats://h"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		c, err := ParseKafkaURL(raw)
		if err != nil {
			if c.Brokers != nil {
				t.Fatalf("error %v with a config %+v", err, c)
			}
			return
		}
		if len(c.Brokers) == 0 || len(c.Brokers) > maxKafkaBrokers {
			t.Fatalf("%q: %d brokers", raw, len(c.Brokers))
		}
		for _, b := range c.Brokers {
			if again, err := kafkaHostPort(b); err != nil || again != b {
				t.Fatalf("%q: broker %q parses again to %q, %v", raw, b, again, err)
			}
		}
		if c.Topic != "" && ValidateSubject(c.Topic) != nil {
			t.Fatalf("%q: topic %q", raw, c.Topic)
		}
		if b, err := BrokerOf(raw); err != nil || b != Kafka {
			t.Fatalf("BrokerOf(%q) = %q, %v", raw, b, err)
		}
	})
}

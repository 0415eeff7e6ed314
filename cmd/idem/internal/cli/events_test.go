package cli

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
)

func TestEventsFlagsRejectBadValues(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		cmd  string
		args []string
		want string
	}{
		{"serve", []string{"--events", "http://x"}, "amqp://USER:PASS@HOST:PORT/ (RabbitMQ) or kafka://HOST:PORT"},
		{"serve", []string{"--events", "kafka://127.0.0.1:1?acks=1"}, "unknown parameter \"acks\""},
		{"serve", []string{"--events", "kafka://127.0.0.1:99999"}, "port \"99999\""},
		{"consume", []string{"--events", "kafka://u:secret@127.0.0.1:1"}, "credentials are not supported"},
		{"serve", []string{"--events", "nats://127.0.0.1:1", "--events-subject", "a.*"}, "--events-subject"},
		{"serve", []string{"--events", "nats://127.0.0.1:1", "--events-subject", "a..b"}, "empty token"},
		{"serve", []string{"--events", "nats://127.0.0.1:1", "--store", "memory"}, "--events needs the records"},
		{"serve", []string{"--events", "nats://127.0.0.1:1", "--events-lease", "10ms"}, "--events-lease"},
		{"consume", nil, "--events is required"},
		{"consume", []string{"--events", "redis://x"}, "nats://HOST:PORT (JetStream), amqp://"},
		{"consume", []string{"--events", "nats://127.0.0.1:1", "--db", "memory"}, "SQLite file"},
		{"consume", []string{"--events", "nats://127.0.0.1:1", "--lease", "1h", "--ttl", "1m"}, "--lease"},
		{"consume", []string{"--events", "nats://127.0.0.1:1", "extra"}, "unexpected argument"},
	} {
		var errs bytes.Buffer
		code := Main(context.Background(), append([]string{c.cmd}, c.args...), io.Discard, &errs)
		if code != exitUsage || !strings.Contains(errs.String(), c.want) {
			t.Errorf("idem %s %v: exit %d, %q; want %d and %q", c.cmd, c.args, code, errs.String(), exitUsage, c.want)
		}
	}
}

func TestConsumeReadsFlagsFromEnvironment(t *testing.T) {
	t.Setenv("IDEM_EVENTS", "ftp://nope")
	var errs bytes.Buffer
	if code := Main(context.Background(), []string{"consume"}, io.Discard, &errs); code != exitUsage || !strings.Contains(errs.String(), "kafka://HOST:PORT") {
		t.Fatalf("exit %d, %q; want IDEM_EVENTS read and refused", code, errs.String())
	}
	var out bytes.Buffer
	if code := Main(context.Background(), []string{"consume", "--help"}, &out, io.Discard); code != exitOK ||
		!strings.Contains(out.String(), "IDEM_EVENTS_SUBJECT") || !strings.Contains(out.String(), "IDEM_ACK_WAIT") {
		t.Fatalf("help: exit %d, %q", code, out.String())
	}
}

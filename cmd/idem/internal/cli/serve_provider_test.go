package cli

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
)

func TestProviderModeRejectsBadFlags(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"serve", "--provider", "127.0.0.1:8081"}, "http:// or https://"},
		{[]string{"serve", "--provider", "http://127.0.0.1:8081", "--store", "redis://127.0.0.1:6379/0"}, "--provider needs"},
		{[]string{"serve", "--provider", "http://127.0.0.1:8081", "--reconcile-interval", "-1s"}, "reconcile-interval"},
		{[]string{"serve", "--provider", "http://127.0.0.1:8081", "--provider-budget", "0"}, "provider-budget"},
		{[]string{"serve", "--provider", "http://127.0.0.1:8081", "--reconcile-concurrency", "0"}, "--reconcile-concurrency must be between 1 and 1000"},
		{[]string{"serve", "--provider", "http://127.0.0.1:8081", "--reconcile-concurrency", "1001"}, "--reconcile-concurrency must be between 1 and 1000"},
		{[]string{"serve", "--provider", "http://127.0.0.1:8081", "--reconcile-max-attempts", "-1"}, "--reconcile-max-attempts must be 0"},
		{[]string{"serve", "--provider", "http://127.0.0.1:8081", "--reconcile-max-age", "-1s"}, "--reconcile-max-age must be positive"},
		{[]string{"serve", "--provider", "http://127.0.0.1:8081", "--reconcile-max-age", "24h"}, "--reconcile-max-age (24h0m0s) must be shorter than --ttl (24h0m0s)"},
		{[]string{"serve", "--provider", "http://127.0.0.1:8081", "--ttl", "30m"}, "--reconcile-max-age (1h0m0s) must be shorter than --ttl (30m0s)"},
		{[]string{"provider", "--decline-rate", "2"}, "--decline-rate must be between 0 and 1"},
		{[]string{"provider", "--fail-rate", "NaN"}, "--fail-rate must be between 0 and 1"},
		{[]string{"provider", "--fail-rate", "1.5"}, "between 0 and 1"},
		{[]string{"provider", "--drop-rate", "-0.1"}, "between 0 and 1"},
		{[]string{"provider", "--delay", "-1s"}, "delay"},
	} {
		var errs bytes.Buffer
		if code := Main(context.Background(), c.args, io.Discard, &errs); code != exitUsage || !strings.Contains(errs.String(), c.want) {
			t.Errorf("%q: exit %d, %q; want %d mentioning %q", c.args, code, errs.String(), exitUsage, c.want)
		}
	}
}

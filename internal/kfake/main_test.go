package main

import (
	"bufio"
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// The cluster starts on free ports, prints its address, takes records,
// and stops with its context.
func TestRun(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rctx, stop := context.WithCancel(ctx)
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- run(rctx, []string{"-port", "0", "-brokers", "2"}, pw, io.Discard)
		pw.Close()
	}()
	line, err := bufio.NewReader(pr).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	go func() { _, _ = io.Copy(io.Discard, pr) }()
	_, addrs, ok := strings.Cut(strings.TrimSpace(line), " on ")
	if !ok || strings.Count(addrs, ",") != 1 {
		t.Fatalf("first line %q", line)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(addrs, ",")...), kgo.AllowAutoTopicCreation())
	if err != nil {
		t.Fatal(err)
	}
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "t", Value: []byte("v")}).FirstErr(); err != nil {
		t.Error(err)
	}
	cl.Close()
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestRunRefusesBadFlags(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"-port", "-1"}, {"-brokers", "0"}, {"-log-level", "loud"}, {"extra"}} {
		if err := run(context.Background(), args, io.Discard, io.Discard); err == nil {
			t.Errorf("%v accepted", args)
		}
	}
}

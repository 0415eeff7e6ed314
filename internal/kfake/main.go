// Command kfake runs franz-go's in-process Kafka cluster
// (github.com/twmb/franz-go/pkg/kfake) on a port of your choice, so that
// `idem serve --events kafka://...` and `idem consume --events kafka://...`
// can be tried where no Kafka broker is installed:
//
//	go run ./internal/kfake -port 9092
//
// It is a test double, not Kafka: records live in memory (or in -data-dir)
// and it has no replication. It listens on 127.0.0.1 only and runs until
// SIGINT or SIGTERM. This module is not published; nobody imports it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/twmb/franz-go/pkg/kfake"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "kfake:", err)
		}
		os.Exit(2)
	}
}

// run starts the cluster the flags in args describe, prints its addresses
// to stdout, and stops it when ctx ends.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("kfake", flag.ContinueOnError)
	fs.SetOutput(stderr)
	port := fs.Int("port", 9092, "port of the first broker; the others take the next ports (0: free ports)")
	brokers := fs.Int("brokers", 1, "number of brokers")
	partitions := fs.Int("partitions", 3, "partitions of a topic created without a count")
	dataDir := fs.String("data-dir", "", "keep the cluster's state in this directory across restarts (default: memory only)")
	autoCreate := fs.Bool("auto-create", true, "create a topic on its first use, as Kafka's auto.create.topics.enable does")
	logLevel := fs.String("log-level", "none", "kfake's log level: none, error, warn, info or debug")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if *port < 0 || *port > 65535 || *brokers < 1 || *brokers > 16 || *partitions < 1 {
		return errors.New("-port must be 0 to 65535, -brokers 1 to 16, -partitions at least 1")
	}
	levels := map[string]kfake.LogLevel{"none": kfake.LogLevelNone, "error": kfake.LogLevelError,
		"warn": kfake.LogLevelWarn, "info": kfake.LogLevelInfo, "debug": kfake.LogLevelDebug}
	level, ok := levels[*logLevel]
	if !ok {
		return fmt.Errorf("-log-level must be none, error, warn, info or debug, not %q", *logLevel)
	}
	opts := []kfake.Opt{
		kfake.NumBrokers(*brokers),
		kfake.DefaultNumPartitions(*partitions),
		kfake.WithLogger(kfake.BasicLogger(stderr, level)),
	}
	if *port != 0 {
		ports := make([]int, *brokers)
		for i := range ports {
			ports[i] = *port + i
		}
		opts = append(opts, kfake.Ports(ports...))
	}
	if *autoCreate {
		opts = append(opts, kfake.AllowAutoTopicCreation())
	}
	if *dataDir != "" {
		opts = append(opts, kfake.DataDir(*dataDir))
	}
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		return err
	}
	defer c.Close()
	addrs := strings.Join(c.ListenAddrs(), ",")
	fmt.Fprintf(stdout, "kfake: a Kafka test cluster (in memory, not Kafka) on %s\n", addrs)
	fmt.Fprintf(stdout, "try:   idem serve --events kafka://%s\n", addrs)
	fmt.Fprintf(stdout, "       idem consume --events kafka://%s --db ledger.db\n", addrs)
	<-ctx.Done()
	return nil
}

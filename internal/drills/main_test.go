package drills_test

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// go-redis logs every failed dial through its package logger; the
	// drills provoke thousands on purpose.
	redis.SetLogger(quietLogger{})
	// toxiproxy's own link goroutines can stay blocked on a channel send
	// after their proxy was stopped in the middle of a stream (the lagging
	// Redis drill stops the replication link's proxy on purpose, to lose
	// what it held); they belong to the proxy library, not to idem.
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/Shopify/toxiproxy/v2/toxics.(*ToxicStub).Run"))
}

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

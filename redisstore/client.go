package redisstore

import (
	"context"
	"net"

	"github.com/redis/go-redis/v9"
)

// RecommendOptions sets the options of a go-redis client that the store
// works best with (README.md, "Client options"), keeping every other one:
//
//   - ContextTimeoutEnabled: each store call's deadline (idem's
//     StoreTimeout) bounds its wait for Redis, not only ReadTimeout.
//   - a Dialer, wrapping opts.Dialer (or go-redis's own), whose
//     connections have no SyscallConn method, so that go-redis does not
//     peek at the socket before every command (one system call and three
//     allocations each), as it never does for TLS connections. A
//     connection that Redis closed is then found by the command that uses
//     it, and go-redis sends that command again on a new connection
//     unless MaxRetries is negative.
//
// Call it before redis.NewClient.
func RecommendOptions(opts *redis.Options) {
	opts.ContextTimeoutEnabled = true
	dial := opts.Dialer
	if dial == nil {
		dial = redis.NewDialer(opts)
	}
	opts.Dialer = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return struct{ net.Conn }{c}, nil
	}
}

package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// DefaultWaitTimeout is the default of Config.WaitTimeout.
const DefaultWaitTimeout = 100 * time.Millisecond

// ErrNotReplicated is returned (wrapped) by Claim, Renew, Complete and
// Release when Config.WaitReplicas is set and fewer replicas than that
// acknowledged the write within Config.WaitTimeout. The write was applied
// on the master but may not survive a failover, so the store does not
// confirm it: the middleware answers 503 and fails closed.
var ErrNotReplicated = errors.New("redisstore: write not acknowledged by enough replicas")

// run runs script with the arguments of c (the record key first). With Config.WaitReplicas set it runs
// the script and then WAIT on one connection of the key's master (WAIT
// counts the replicas that acknowledged the writes of its own connection,
// so both must share one), and fails with ErrNotReplicated when too few
// replicas acknowledged in time.
func (s *Store) run(ctx context.Context, script *script, c *call) (cmd *redis.Cmd) {
	if s.waitReplicas == 0 {
		return script.run(ctx, s.client, c)
	}
	fail := func(err error) *redis.Cmd {
		cmd := redis.NewCmd(ctx)
		cmd.SetErr(err)
		return cmd
	}
	var node *redis.Client
	switch cl := s.client.(type) {
	case *redis.Client:
		node = cl
	case *redis.ClusterClient:
		var err error
		if node, err = cl.MasterForKey(ctx, c.strs[0]); err != nil {
			return fail(err)
		}
		defer func() {
			// A dedicated connection does not follow redirections (MOVED
			// after a failover): on any failure, refresh the slot map so
			// that the next call goes to the current master.
			if cmd != nil && cmd.Err() != nil {
				cl.ReloadState(context.WithoutCancel(ctx))
			}
		}()
	}
	conn := node.Conn()
	defer conn.Close()
	if cmd = script.run(ctx, conn, c); cmd.Err() != nil {
		return cmd
	}
	n, err := conn.Wait(ctx, s.waitReplicas, s.waitTimeout).Result()
	if err != nil {
		return fail(fmt.Errorf("WAIT: %w", err))
	}
	if n < int64(s.waitReplicas) {
		return fail(fmt.Errorf("%w: %d of %d replicas within %v", ErrNotReplicated, n, s.waitReplicas, s.waitTimeout))
	}
	return cmd
}

// waitConfig validates the WAIT fields of c for client.
func waitConfig(client redis.UniversalClient, c *Config) error {
	if c.WaitReplicas < 0 {
		return errors.New("redisstore: WaitReplicas is negative")
	}
	if c.WaitTimeout < 0 {
		return errors.New("redisstore: WaitTimeout is negative")
	}
	if c.WaitTimeout == 0 {
		c.WaitTimeout = DefaultWaitTimeout
	}
	if c.WaitReplicas == 0 {
		return nil
	}
	switch client.(type) {
	case *redis.Client, *redis.ClusterClient:
		return nil
	}
	return fmt.Errorf("redisstore: WaitReplicas needs a *redis.Client or *redis.ClusterClient, not %s",
		strings.TrimPrefix(fmt.Sprintf("%T", client), "*"))
}

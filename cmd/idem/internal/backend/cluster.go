package backend

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/idemhq/idem/redisstore"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// RedisCluster is a Redis Cluster, named by a redis+cluster:// (or
// rediss+cluster:// for TLS) URL.
const RedisCluster Kind = "redis-cluster"

// openRedisCluster opens a records store on a Redis Cluster named by
//
//	redis+cluster://[user:password@]host:port[,host:port...][?params]
//
// The hosts are seed nodes: any reachable one tells the client the whole
// cluster's layout, so listing two or three of them survives the loss of
// one. The query parameters are go-redis's cluster options (dial_timeout,
// read_timeout, write_timeout, pool_size, ... as in redis.ParseClusterURL,
// each timeout 1 s unless given) and idem's own:
//
//   - prefix=TEXT starts every key (default "idem:");
//   - wait_replicas=N makes every claim and completion wait until N
//     replicas acknowledged it (Redis WAIT; redisstore.Config.WaitReplicas),
//     so that a failover does not forget it;
//   - wait_timeout=DURATION bounds that wait (default 100ms).
func openRedisCluster(ctx context.Context, spec string) (*Store, error) {
	scheme, rest, _ := strings.Cut(spec, "+cluster://")
	authority, query, _ := strings.Cut(rest, "?")
	authority, path, _ := strings.Cut(authority, "/")
	if path != "" {
		return nil, errors.New("redis cluster: a cluster has only database 0; remove the path")
	}
	userinfo, hosts := "", authority
	if at := strings.LastIndexByte(authority, '@'); at >= 0 {
		userinfo, hosts = authority[:at+1], authority[at+1:]
	}
	seeds := strings.Split(hosts, ",")
	q, err := url.ParseQuery(query)
	if err != nil {
		return nil, fmt.Errorf("redis cluster: %w", err)
	}
	var cfg redisstore.Config
	cfg.Prefix = q.Get("prefix")
	if v := q.Get("wait_replicas"); v != "" {
		if cfg.WaitReplicas, err = strconv.Atoi(v); err != nil {
			return nil, fmt.Errorf("redis cluster: wait_replicas: %w", err)
		}
	}
	if v := q.Get("wait_timeout"); v != "" {
		if cfg.WaitTimeout, err = time.ParseDuration(v); err != nil {
			return nil, fmt.Errorf("redis cluster: wait_timeout: %w", err)
		}
	}
	for _, name := range []string{"prefix", "wait_replicas", "wait_timeout"} {
		q.Del(name)
	}
	for _, s := range seeds[1:] {
		q.Add("addr", s)
	}
	opts, err := redis.ParseClusterURL(scheme + "://" + userinfo + seeds[0] + "?" + q.Encode())
	if err != nil {
		return nil, fmt.Errorf("redis cluster: %w", err)
	}
	// As for a single Redis: an unresponsive node must turn into a prompt
	// 503, not go-redis's default 5 s per request.
	if !q.Has("dial_timeout") {
		opts.DialTimeout = redisTimeout
	}
	if !q.Has("read_timeout") {
		opts.ReadTimeout = redisTimeout
	}
	if !q.Has("write_timeout") {
		opts.WriteTimeout = redisTimeout
	}
	// idem does not use maintenance notifications; go-redis v9.23 races
	// on their handshake between a node client and the dedicated
	// connections WaitReplicas uses.
	opts.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
	client := redis.NewClusterClient(opts)
	// As for a single Redis: the cluster must answer at start.
	if err := client.Ping(ctx).Err(); err != nil {
		client.Close()
		return nil, fmt.Errorf("redis cluster %s: cannot connect: %w", redact(spec), err)
	}
	s, err := redisstore.New(client, &cfg)
	if err != nil {
		client.Close()
		return nil, fmt.Errorf("redis cluster: %w", err)
	}
	return &Store{Records: s, Kind: RedisCluster, Where: "Redis Cluster " + redact(spec),
		Ping:  func(ctx context.Context) error { return client.Ping(ctx).Err() },
		Ready: func(ctx context.Context) error { return clusterReady(ctx, client) },
		close: client.Close}, nil
}

// clusterReady pings every master the client knows (one goroutine each,
// ended by ctx): a cluster with one master down answers some keys and not
// others, which is not ready. A failure names the node.
func clusterReady(ctx context.Context, client *redis.ClusterClient) error {
	return client.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
		if err := node.Ping(ctx).Err(); err != nil {
			return fmt.Errorf("master %s: %w", node.Options().Addr, err)
		}
		return nil
	})
}

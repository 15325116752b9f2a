package redistest

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Cluster is a Redis Cluster of masters and no replicas, each a Server,
// joined by redis-cli --cluster create.
type Cluster struct {
	// Nodes are the masters, in the order they were started.
	Nodes []*Server
}

// ClusterConfig says what cluster StartCluster starts.
type ClusterConfig struct {
	// Masters is the number of masters; 0 means 3, the fewest
	// redis-cli --cluster create accepts.
	Masters int
	// FullCoverage sets cluster-require-full-coverage. When true (Redis's
	// default) every master refuses every key once a slot is unserved;
	// when false the live masters keep serving their slots when one is
	// lost.
	FullCoverage bool
}

// ClusterSetup bounds a cluster's setup after its nodes have started:
// joining them and waiting until every node agrees that the cluster is
// whole. A loaded machine makes a correct cluster slow, not broken.
const ClusterSetup = 60 * time.Second

// nodeTimeout is cluster-node-timeout: how long a master may be unreachable
// before the others mark it failed.
const nodeTimeout = "1000" // milliseconds

// StartCluster starts a cluster as cfg says and returns once it is ready:
// every node reports cluster_state:ok with all 16384 slots assigned and
// every node known, and every node reports the same slot map, so that a
// client that loads the map from any node routes every key where it
// belongs.
func StartCluster(cfg ClusterConfig) (*Cluster, error) {
	if _, err := exec.LookPath("redis-cli"); err != nil {
		return nil, fmt.Errorf("redis-cli is not on PATH (on Debian: apt-get install redis-tools): %w", err)
	}
	masters := cfg.Masters
	if masters == 0 {
		masters = 3
	}
	if masters < 3 {
		return nil, fmt.Errorf("a cluster needs at least 3 masters, not %d", masters)
	}
	c := &Cluster{}
	for range masters {
		s, err := Start("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-require-full-coverage", map[bool]string{true: "yes", false: "no"}[cfg.FullCoverage],
			"--cluster-node-timeout", nodeTimeout)
		if err != nil {
			return nil, errors.Join(err, c.Stop())
		}
		c.Nodes = append(c.Nodes, s)
	}
	ctx, cancel := context.WithTimeout(context.Background(), ClusterSetup)
	defer cancel()
	args := append([]string{"--cluster", "create"}, c.Addrs()...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.CommandContext(ctx, "redis-cli", args...).CombinedOutput(); err != nil {
		return nil, errors.Join(fmt.Errorf("redis-cli --cluster create: %w\n%s", err, out), c.Stop())
	}
	if err := c.AwaitReady(ctx); err != nil {
		return nil, errors.Join(err, c.Stop())
	}
	return c, nil
}

// NewCluster is StartCluster for a test: it fails tb (never skips it) when
// the cluster does not start, and stops it when the test ends.
func NewCluster(tb testing.TB, cfg ClusterConfig) *Cluster {
	tb.Helper()
	c, err := StartCluster(cfg)
	return forTest(tb, c, err)
}

// Addrs returns the nodes' addresses, in the order of Nodes.
func (c *Cluster) Addrs() []string {
	var a []string
	for _, n := range c.Nodes {
		a = append(a, n.Addr())
	}
	return a
}

// AwaitReady waits, within ctx, until the cluster is ready (see
// StartCluster). Its error names what the last node asked lacked.
func (c *Cluster) AwaitReady(ctx context.Context) error {
	var last string
	for {
		ok, why := c.ready(ctx)
		if ok {
			return nil
		}
		last = why
		select {
		case <-ctx.Done():
			return fmt.Errorf("the cluster was not ready: %w: %s", ctx.Err(), last)
		case <-time.After(20 * time.Millisecond): // polling real servers' readiness
		}
	}
}

// ready asks every node once whether the cluster is ready, and when not,
// says why.
func (c *Cluster) ready(ctx context.Context) (bool, string) {
	var want string
	for i, n := range c.Nodes {
		cl := n.Client(nil)
		info, err := cl.ClusterInfo(ctx).Result()
		var shards []redis.ClusterShard
		if err == nil {
			shards, err = cl.ClusterShards(ctx).Result()
		}
		cl.Close()
		view := slotMap(shards)
		switch {
		case err != nil:
			return false, fmt.Sprintf("node %s: %v", n.Addr(), err)
		case !strings.Contains(info, "cluster_state:ok"), !strings.Contains(info, "cluster_slots_assigned:16384"),
			!strings.Contains(info, "cluster_known_nodes:"+strconv.Itoa(len(c.Nodes))):
			return false, fmt.Sprintf("node %s: %q", n.Addr(), info)
		case i > 0 && view != want:
			return false, fmt.Sprintf("node %s maps the slots %s, node %s %s", n.Addr(), view, c.Nodes[0].Addr(), want)
		}
		if i == 0 {
			want = view
		}
	}
	return true, ""
}

// slotMap describes which master serves which slots, in an order that
// does not depend on the node asked.
func slotMap(shards []redis.ClusterShard) string {
	var parts []string
	for _, sh := range shards {
		for _, n := range sh.Nodes {
			if n.Role == "master" {
				parts = append(parts, fmt.Sprintf("%v:%s:%d", sh.Slots, n.IP, n.Port))
			}
		}
	}
	slices.Sort(parts)
	return strings.Join(parts, " ")
}

// Client returns a new Cluster client of c, with ContextTimeoutEnabled and
// the options then adjusted by edit (when not nil), once it reaches every
// master (within ClusterSetup; else it fails tb). It is closed when the
// test ends.
func (c *Cluster) Client(tb testing.TB, edit func(*redis.ClusterOptions)) *redis.ClusterClient {
	tb.Helper()
	o := &redis.ClusterOptions{Addrs: c.Addrs(), ContextTimeoutEnabled: true}
	if edit != nil {
		edit(o)
	}
	cl := redis.NewClusterClient(o)
	tb.Cleanup(func() { cl.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), ClusterSetup)
	defer cancel()
	if err := cl.ForEachShard(ctx, func(ctx context.Context, sh *redis.Client) error { return sh.Ping(ctx).Err() }); err != nil {
		tb.Fatal(err)
	}
	return cl
}

// Owner returns the node that serves slot, by the shards the first node
// reports (which every node agrees on once the cluster is ready).
func (c *Cluster) Owner(tb testing.TB, slot int64) *Server {
	tb.Helper()
	cl := c.Nodes[0].Client(nil)
	defer cl.Close()
	shards, err := cl.ClusterShards(context.Background()).Result()
	if err != nil {
		tb.Fatal(err)
	}
	for _, sh := range shards {
		for _, r := range sh.Slots {
			if r.Start <= slot && slot <= r.End {
				for _, nd := range sh.Nodes {
					for _, n := range c.Nodes {
						if nd.Role == "master" && int(nd.Port) == n.Port() {
							return n
						}
					}
				}
			}
		}
	}
	tb.Fatalf("no node serves slot %d", slot)
	return nil
}

// Slot returns the cluster slot of key, as a node computes it.
func (c *Cluster) Slot(tb testing.TB, key string) int64 {
	tb.Helper()
	cl := c.Nodes[0].Client(nil)
	defer cl.Close()
	s, err := cl.ClusterKeySlot(context.Background(), key).Result()
	if err != nil {
		tb.Fatal(err)
	}
	return s
}

// Stop stops every node (see Server.Stop).
func (c *Cluster) Stop() error {
	var errs []error
	for _, n := range c.Nodes {
		errs = append(errs, n.Stop())
	}
	return errors.Join(errs...)
}

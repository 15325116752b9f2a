package redisstore

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// testCluster is a Redis Cluster of three masters and no replicas, each a
// redis-server on a free loopback port, joined by redis-cli --cluster
// create. The test that starts it owns it: the servers are killed and their
// directory removed when the test ends.
type testCluster struct {
	nodes []*server
}

// startCluster starts a three-master cluster and waits until it is ready
// (see awaitReady). Like the single-node tests it fails when
// redis-server or redis-cli is missing, unless the opt-out is set.
func startCluster(t testing.TB) *testCluster {
	t.Helper()
	return startClusterCoverage(t, false)
}

// startClusterCoverage is startCluster with cluster-require-full-coverage
// set to fullCoverage: when yes (Redis's default), every master refuses
// every key once a slot is unserved; startCluster sets no, so that the
// live masters keep serving their slots when one is lost.
func startClusterCoverage(t testing.TB, fullCoverage bool) *testCluster {
	t.Helper()
	needRedis(t)
	if _, err := exec.LookPath("redis-cli"); err != nil {
		t.Fatalf("cluster tests need redis-cli on PATH (or %s=1 to skip every Redis test): %v", noRedisEnv, err)
	}
	dir := t.TempDir()
	c := &testCluster{}
	t.Cleanup(c.stop) // runs before TempDir's removal
	for range 3 {
		s, err := startClusterNode(dir, fullCoverage)
		if err != nil {
			t.Fatal(err)
		}
		c.nodes = append(c.nodes, s)
	}
	// Every step below waits for readiness, never a fixed time, within one
	// generous deadline: a loaded machine makes a correct cluster slow,
	// not broken.
	ctx, cancel := context.WithTimeout(context.Background(), clusterSetup)
	defer cancel()
	args := []string{"--cluster", "create"}
	for _, n := range c.nodes {
		args = append(args, n.addr())
	}
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.CommandContext(ctx, "redis-cli", args...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	if err := c.awaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	return c
}

// clusterSetup bounds a cluster's setup: starting the nodes aside, joining
// them and waiting until every node agrees that the cluster is whole.
const clusterSetup = 60 * time.Second

// awaitReady waits, within ctx, until every node reports cluster_state:ok
// with all 16384 slots assigned and every node known, and all nodes
// report the same slot map: only then does a client that loads the map
// from any node route every key where it belongs.
func (c *testCluster) awaitReady(ctx context.Context) error {
	var last string
	for {
		ready := true
		var want string
		for i, n := range c.nodes {
			cl := n.client(nil)
			info, err := cl.ClusterInfo(ctx).Result()
			var shards []redis.ClusterShard
			if err == nil {
				shards, err = cl.ClusterShards(ctx).Result()
			}
			cl.Close()
			view := slotMap(shards)
			switch {
			case err != nil:
				last = fmt.Sprintf("node %s: %v", n.addr(), err)
			case !strings.Contains(info, "cluster_state:ok"), !strings.Contains(info, "cluster_slots_assigned:16384"),
				!strings.Contains(info, "cluster_known_nodes:"+strconv.Itoa(len(c.nodes))):
				last = fmt.Sprintf("node %s: %q", n.addr(), info)
			case i > 0 && view != want:
				last = fmt.Sprintf("node %s maps the slots %s, node %s %s", n.addr(), view, c.nodes[0].addr(), want)
			default:
				if i == 0 {
					want = view
				}
				continue
			}
			ready = false
			break
		}
		if ready {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the cluster was not ready within %v: %s", clusterSetup, last)
		case <-time.After(20 * time.Millisecond): // polling real servers' readiness
		}
	}
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

// client returns a new Cluster client of c, with opts adjusted by edit.
func (c *testCluster) client(t testing.TB, edit func(*redis.ClusterOptions)) *redis.ClusterClient {
	t.Helper()
	o := &redis.ClusterOptions{ContextTimeoutEnabled: true}
	for _, n := range c.nodes {
		o.Addrs = append(o.Addrs, n.addr())
	}
	if edit != nil {
		edit(o)
	}
	cl := redis.NewClusterClient(o)
	t.Cleanup(func() { cl.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), clusterSetup)
	defer cancel()
	if err := cl.ForEachShard(ctx, func(ctx context.Context, sh *redis.Client) error { return sh.Ping(ctx).Err() }); err != nil {
		t.Fatal(err)
	}
	return cl
}

// owner returns the node that serves slot, by the shards node 0 reports
// (which every node agrees on once the cluster is ok).
func (c *testCluster) owner(t testing.TB, slot int64) *server {
	t.Helper()
	cl := c.nodes[0].client(nil)
	defer cl.Close()
	shards, err := cl.ClusterShards(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, sh := range shards {
		for _, r := range sh.Slots {
			if r.Start <= slot && slot <= r.End {
				for _, nd := range sh.Nodes {
					for _, n := range c.nodes {
						if nd.Role == "master" && int(nd.Port) == n.port {
							return n
						}
					}
				}
			}
		}
	}
	t.Fatalf("no node serves slot %d", slot)
	return nil
}

// slot returns the cluster slot of key, as a node computes it.
func (c *testCluster) slot(t testing.TB, key string) int64 {
	t.Helper()
	cl := c.nodes[0].client(nil)
	defer cl.Close()
	s, err := cl.ClusterKeySlot(context.Background(), key).Result()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func (c *testCluster) stop() {
	for _, n := range c.nodes {
		select {
		case <-n.done:
		default:
			n.kill()
		}
	}
}

// startClusterNode starts a cluster-enabled redis-server on a free port
// whose cluster bus port (the port plus 10000) is free too.
func startClusterNode(dir string, fullCoverage bool) (*server, error) {
	port, err := freeClusterPort()
	if err != nil {
		return nil, err
	}
	s := &server{port: port}
	cmd := exec.Command("redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--cluster-enabled", "yes", "--cluster-config-file", filepath.Join(dir, "nodes-"+strconv.Itoa(port)+".conf"),
		"--dir", dir, "--save", "", "--appendonly", "no", "--protected-mode", "no",
		"--cluster-require-full-coverage", map[bool]string{true: "yes", false: "no"}[fullCoverage],
		"--cluster-node-timeout", "1000")
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	done := make(chan struct{})
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(out)
		signalled := false
		for sc.Scan() {
			if !signalled && strings.Contains(sc.Text(), "Ready to accept connections") {
				close(ready)
				signalled = true
			}
		}
		cmd.Wait()
		if !signalled {
			close(ready)
		}
		close(done)
	}()
	s.cmd, s.done = cmd, done
	select {
	case <-ready:
	case <-time.After(clusterSetup):
		s.kill()
		return nil, fmt.Errorf("cluster node on port %d did not start", port)
	}
	select {
	case <-done:
		return nil, fmt.Errorf("cluster node on port %d exited at start", port)
	default:
	}
	return s, nil
}

func freeClusterPort() (int, error) {
	for range 50 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		port := l.Addr().(*net.TCPAddr).Port
		if port+10000 > 65535 {
			l.Close()
			continue
		}
		bus, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port+10000))
		l.Close()
		if err != nil {
			continue
		}
		bus.Close()
		return port, nil
	}
	return 0, fmt.Errorf("no free port pair for a cluster node")
}

package redistest

import (
	"context"
	"errors"
	"go/parser"
	"go/token"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func skipIfDisabled(t *testing.T) {
	t.Helper()
	if Disabled() {
		t.Skipf("%s=1: no redis-server", NoRedisEnv)
	}
}

// ctx returns a context that ends after d or with the test.
func ctx(t *testing.T, d time.Duration) context.Context {
	c, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return c
}

func TestStartIsReadyAndStopRemovesAll(t *testing.T) {
	skipIfDisabled(t)
	s, err := Start()
	require.NoError(t, err)
	t.Cleanup(func() { s.Stop() })

	host, _, err := net.SplitHostPort(s.Addr())
	require.NoError(t, err)
	assert.Equal(t, "127.0.0.1", host)
	assert.Equal(t, "127.0.0.1:"+strconv.Itoa(s.Port()), s.Addr())
	assert.True(t, s.Running())

	// Ready when Start returns: the first command is answered, by the
	// process Start started, which persists nothing.
	c := s.Client(nil)
	defer c.Close()
	require.NoError(t, c.Ping(ctx(t, 5*time.Second)).Err())
	info, err := c.Info(ctx(t, 5*time.Second), "server").Result()
	require.NoError(t, err)
	assert.Contains(t, info, "process_id:"+strconv.Itoa(s.Pid())+"\r\n")
	for name, want := range map[string]string{"save": "", "appendonly": "no", "dir": s.Dir()} {
		got, err := c.ConfigGet(ctx(t, 5*time.Second), name).Result()
		require.NoError(t, err)
		assert.Equal(t, want, got[name], name)
	}
	_, err = os.Stat(s.Dir())
	require.NoError(t, err)

	require.NoError(t, s.Stop())
	assert.False(t, s.Running())
	assert.Zero(t, s.Pid())
	_, err = os.Stat(s.Dir())
	assert.True(t, errors.Is(err, os.ErrNotExist), "the directory is removed: %v", err)
	assertRefused(t, s.Addr())
	assert.NoError(t, s.Stop(), "a second Stop does nothing")
	assert.Error(t, s.Restart(), "a stopped server does not start again")
}

// assertRefused checks that nothing listens on addr.
func assertRefused(t *testing.T, addr string) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err == nil {
		conn.Close()
	}
	assert.True(t, errors.Is(err, syscall.ECONNREFUSED), "dial %s: %v", addr, err)
}

func TestPauseKeepsDataAndAnswersNothing(t *testing.T) {
	skipIfDisabled(t)
	s := New(t)
	c := s.Client(func(o *redis.Options) { o.MaxRetries = -1 })
	defer c.Close()
	require.NoError(t, c.Set(ctx(t, 5*time.Second), "k", "v", 0).Err())

	require.NoError(t, s.Pause())
	assert.True(t, s.Running(), "a paused server is running")
	start := time.Now()
	err := c.Get(ctx(t, 100*time.Millisecond), "k").Err()
	var ne net.Error
	assert.True(t, errors.As(err, &ne) && ne.Timeout(), "a paused server answers nothing: %v", err)
	assert.Less(t, time.Since(start), 5*time.Second)

	require.NoError(t, s.Resume())
	got, err := c.Get(ctx(t, 5*time.Second), "k").Result()
	require.NoError(t, err)
	assert.Equal(t, "v", got, "the data survives a pause")
}

func TestKillAndRestartLoseData(t *testing.T) {
	skipIfDisabled(t)
	s := New(t)
	addr, pid := s.Addr(), s.Pid()
	c := s.Client(func(o *redis.Options) { o.MaxRetries = -1 })
	defer c.Close()
	require.NoError(t, c.Set(ctx(t, 5*time.Second), "k", "v", 0).Err())

	require.NoError(t, s.Kill())
	assert.False(t, s.Running())
	assertRefused(t, addr)
	require.NoError(t, s.Kill(), "killing a dead server does nothing")
	assert.Error(t, s.Pause(), "nothing to pause")

	require.NoError(t, s.Restart())
	assert.Equal(t, addr, s.Addr(), "the same port")
	assert.NotEqual(t, pid, s.Pid(), "a new process")
	err := c.Get(ctx(t, 5*time.Second), "k").Err()
	assert.ErrorIs(t, err, redis.Nil, "a restarted server starts empty")

	// Restart of a running server kills it first.
	require.NoError(t, c.Set(ctx(t, 5*time.Second), "k", "v", 0).Err())
	pid = s.Pid()
	require.NoError(t, s.Restart())
	assert.NotEqual(t, pid, s.Pid())
	assert.ErrorIs(t, c.Get(ctx(t, 5*time.Second), "k").Err(), redis.Nil)
}

// TestStopEndsAPausedServer: Stop resumes the process so that it can act
// on SIGTERM, rather than wait and kill it.
func TestStopEndsAPausedServer(t *testing.T) {
	skipIfDisabled(t)
	s, err := Start()
	require.NoError(t, err)
	require.NoError(t, s.Pause())
	start := time.Now()
	require.NoError(t, s.Stop())
	assert.Less(t, time.Since(start), stopTimeout, "the paused server exited on SIGTERM")
	assert.False(t, s.Running())
}

// TestFailedStartCarriesTheLog: a server that cannot start fails Start at
// once, with the end of its log in the error.
func TestFailedStartCarriesTheLog(t *testing.T) {
	skipIfDisabled(t)
	start := time.Now()
	s, err := Start("--no-such-directive", "yes")
	require.Error(t, err)
	assert.Nil(t, s)
	assert.Contains(t, err.Error(), "exited before it was ready")
	assert.Contains(t, err.Error(), "no-such-directive", "the server's own complaint")
	assert.Less(t, time.Since(start), StartTimeout, "not a wait for the deadline")
}

// TestReadinessIsTheProcess: a server on the port that is not the process
// started is not ready.
func TestReadinessIsTheProcess(t *testing.T) {
	skipIfDisabled(t)
	s := New(t)
	require.NoError(t, probe(s.Addr(), s.Pid()))
	err := probe(s.Addr(), s.Pid()+1)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "is not process")

	// Nothing listening: refused, and a wait for it ends at its deadline.
	require.NoError(t, s.Kill())
	require.Error(t, probe(s.Addr(), s.Pid()))
	done := make(chan struct{})
	start := time.Now()
	err = awaitServer(s.Addr(), 1, done, 200*time.Millisecond)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "was not ready within")
	assert.Less(t, time.Since(start), 5*time.Second)
}

// TestMissingBinariesFailWithThePackage: without redis-server or redis-cli
// on PATH a start fails (never skips) and names the Debian package.
func TestMissingBinariesFailWithThePackage(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	_, err := Start()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "apt-get install redis-server")
	_, err = StartCluster(ClusterConfig{})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "apt-get install redis-tools")
}

func TestClusterIsReady(t *testing.T) {
	skipIfDisabled(t)
	for _, full := range []bool{false, true} {
		t.Run("full coverage "+strconv.FormatBool(full), func(t *testing.T) {
			c := NewCluster(t, ClusterConfig{FullCoverage: full})
			require.Len(t, c.Nodes, 3)
			want := map[bool]string{true: "yes", false: "no"}[full]
			var views []string
			for _, n := range c.Nodes {
				nc := n.Client(nil)
				info, err := nc.ClusterInfo(ctx(t, 5*time.Second)).Result()
				require.NoError(t, err)
				assert.Contains(t, info, "cluster_state:ok")
				assert.Contains(t, info, "cluster_known_nodes:3")
				cfg, err := nc.ConfigGet(ctx(t, 5*time.Second), "cluster-require-full-coverage").Result()
				require.NoError(t, err)
				assert.Equal(t, want, cfg["cluster-require-full-coverage"])
				shards, err := nc.ClusterShards(ctx(t, 5*time.Second)).Result()
				require.NoError(t, err)
				views = append(views, slotMap(shards))
				nc.Close()
			}
			assert.Equal(t, views[0], views[1])
			assert.Equal(t, views[0], views[2])
			assert.Equal(t, 3, strings.Count(views[0], ":127.0.0.1:"), "three masters share the slots")

			// Every key routes, and lands on the node Owner names.
			cl := c.Client(t, nil)
			for _, key := range []string{"a", "b", "c", "d", "e", "f"} {
				require.NoError(t, cl.Set(ctx(t, 5*time.Second), key, "v", 0).Err())
				owner := c.Owner(t, c.Slot(t, key))
				oc := owner.Client(nil)
				got, err := oc.Get(ctx(t, 5*time.Second), key).Result()
				oc.Close()
				require.NoError(t, err, "key %s on %s", key, owner.Addr())
				assert.Equal(t, "v", got)
			}

			// A lost master: the cluster is no longer ready, and AwaitReady
			// says so by its deadline.
			require.NoError(t, c.Nodes[2].Kill())
			err := c.AwaitReady(ctx(t, 300*time.Millisecond))
			require.Error(t, err)
			assert.ErrorIs(t, err, context.DeadlineExceeded)
			assert.Contains(t, err.Error(), c.Nodes[2].Addr())
		})
	}
}

// TestLibraryCodeDoesNotImportIt: in the redisstore module only tests use
// the harness (the tools that use it live in modules of their own).
func TestLibraryCodeDoesNotImportIt(t *testing.T) {
	const self = "github.com/ratekit/ratelimit/redisstore/internal/redistest"
	root := filepath.Join("..", "..")
	checked := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != root && fileExists(filepath.Join(path, "go.mod")) {
				return filepath.SkipDir // another module
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		checked++
		for _, imp := range f.Imports {
			if strings.Trim(imp.Path.Value, `"`) == self {
				t.Errorf("%s imports the test harness", path)
			}
		}
		return nil
	})
	require.NoError(t, err)
	assert.Greater(t, checked, 10, "the module's files were read")
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

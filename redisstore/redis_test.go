package redisstore

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// The tests run against a real redis-server that TestMain starts on a free
// loopback port and stops at the end. Without redis-server on PATH they
// fail, unless REDISSTORE_NO_REDIS=1 says to skip them on purpose.
const noRedisEnv = "REDISSTORE_NO_REDIS"

// shared is the server most tests use; nil when skipping on purpose.
var shared *server

func TestMain(m *testing.M) {
	if os.Getenv(noRedisEnv) == "1" {
		os.Exit(m.Run()) // every test calls needRedis and skips
	}
	s, err := startServer(0)
	if err != nil {
		fmt.Fprintf(os.Stderr, "redisstore tests need redis-server on PATH (or %s=1 to skip them): %v\n", noRedisEnv, err)
		os.Exit(1)
	}
	shared = s
	code := m.Run()
	s.stop()
	os.Exit(code)
}

// needRedis returns a client of the shared server, skipping the test only
// when the opt-out is set.
func needRedis(t testing.TB) *redis.Client {
	t.Helper()
	if shared == nil {
		t.Skipf("%s=1: no redis-server", noRedisEnv)
	}
	c := shared.client(nil)
	t.Cleanup(func() { c.Close() })
	return c
}

// server is a redis-server process the tests own.
type server struct {
	port int
	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// startServer starts redis-server on port (a free one if 0) and waits until
// it answers.
func startServer(port int) (*server, error) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		return nil, err
	}
	if port == 0 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		port = l.Addr().(*net.TCPAddr).Port
		l.Close()
	}
	s := &server{port: port}
	return s, s.start()
}

func (s *server) start() error {
	cmd := exec.Command("redis-server", "--port", strconv.Itoa(s.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--protected-mode", "no")
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
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
	select {
	case <-ready:
	case <-time.After(10 * time.Second):
		cmd.Process.Kill()
		return fmt.Errorf("redis-server on port %d did not start", s.port)
	}
	s.mu.Lock()
	s.cmd, s.done = cmd, done
	s.mu.Unlock()
	c := s.client(nil)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return c.Ping(ctx).Err()
}

func (s *server) addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

// client returns a new client of this server, with opts adjusted by edit.
func (s *server) client(edit func(*redis.Options)) *redis.Client {
	o := &redis.Options{Addr: s.addr(), ContextTimeoutEnabled: true}
	if edit != nil {
		edit(o)
	}
	return redis.NewClient(o)
}

func (s *server) signal(sig syscall.Signal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cmd.Process.Signal(sig)
}

// kill crashes the server and waits until it is gone.
func (s *server) kill() {
	s.signal(syscall.SIGKILL)
	<-s.done
}

func (s *server) stop() {
	s.signal(syscall.SIGCONT) // a stopped process cannot act on SIGTERM
	s.signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(5 * time.Second):
		s.kill()
	}
}

func fmtSscan(s string, v ...any) (int, error) { return fmt.Sscan(s, v...) }

func i64(v int64) string { return strconv.FormatInt(v, 10) }

package bench

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// addr is the loopback address of the redis-server TestMain started.
var addr string

func TestMain(m *testing.M) {
	cmd, a, err := startRedis()
	if err != nil {
		fmt.Fprintf(os.Stderr, "the benchmarks need redis-server on PATH: %v\n", err)
		os.Exit(1)
	}
	addr = a
	code := m.Run()
	cmd.Process.Kill()
	cmd.Wait()
	os.Exit(code)
}

// startRedis starts a redis-server without persistence on a free loopback
// port and waits, up to a deadline, until it answers.
func startRedis() (*exec.Cmd, string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, "", err
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	cmd := exec.Command("redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--protected-mode", "no")
	if err := cmd.Start(); err != nil {
		return nil, "", err
	}
	a := "127.0.0.1:" + strconv.Itoa(port)
	c := redis.NewClient(&redis.Options{Addr: a})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return cmd, a, nil
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			cmd.Wait()
			return nil, "", fmt.Errorf("redis-server on %s did not answer: %w", a, err)
		}
		time.Sleep(20 * time.Millisecond) // waiting for a real server to start
	}
}

func client(tb testing.TB, pool int) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: addr, PoolSize: pool, ContextTimeoutEnabled: true})
	tb.Cleanup(func() { c.Close() })
	return c
}

// Package redistest starts real redis-server processes for the tests and
// tools of the Redis store: a single server (Start, New) and a Redis
// Cluster of masters (StartCluster, NewCluster). It is the one place that
// starts redis-server and the one readiness check: a server is ready when
// it answers PING on a new connection and says, in INFO server, that it is
// the process this package started; a cluster when every node reports
// cluster_state:ok and every node reports the same slot map.
//
// Every server listens on 127.0.0.1 only, on a free port whose cluster bus
// port (the port plus 10000) is free too, persists nothing, and has a
// directory of its own, which holds its log; an error from a start carries
// the log's end. Every wait has a deadline: a start fails, never hangs.
//
// Without redis-server (or, for a cluster, redis-cli) on PATH a start fails
// with a message naming the Debian package to install. A test binary may
// skip every Redis test on purpose with REDISSTORE_NO_REDIS=1 (see
// [Disabled]).
//
// The package is for tests and tools; the store's own code never imports
// it.
package redistest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// NoRedisEnv names the environment variable that, set to 1, says to skip
// every Redis test on purpose.
const NoRedisEnv = "REDISSTORE_NO_REDIS"

// Disabled reports whether NoRedisEnv=1 asks to skip the Redis tests.
func Disabled() bool { return os.Getenv(NoRedisEnv) == "1" }

// StartTimeout bounds one server's start: from the process's start until it
// answers as ready. A loaded machine makes a correct server slow, not
// broken, so it is generous.
const StartTimeout = 30 * time.Second

// stopTimeout bounds Stop's wait for the server to exit on SIGTERM before
// it is killed.
const stopTimeout = 5 * time.Second

// Server is a redis-server process on a loopback port. Its methods are
// safe for concurrent use.
type Server struct {
	port int
	dir  string
	args []string // redis-server's arguments

	mu      sync.Mutex
	cmd     *exec.Cmd
	done    chan struct{} // closed once cmd has exited and been reaped
	stopped bool          // Stop ran: nothing may start again
}

// Start starts a redis-server without persistence on a free loopback port,
// with extra appended to its arguments (redis-server options such as
// "--maxmemory", "1mb"), and returns once it is ready (see the package
// doc). Should another process take the chosen port first, Start tries
// another.
func Start(extra ...string) (*Server, error) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		return nil, fmt.Errorf("redis-server is not on PATH (on Debian: apt-get install redis-server): %w", err)
	}
	dir, err := os.MkdirTemp("", "redistest-")
	if err != nil {
		return nil, err
	}
	var errs []error
	for range 3 {
		port, err := freePort()
		if err != nil {
			errs = append(errs, err)
			break
		}
		s := &Server{port: port, dir: dir}
		s.args = append([]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
			"--save", "", "--appendonly", "no", "--protected-mode", "no",
			"--dir", dir, "--logfile", ""}, extra...)
		err = s.start()
		if err == nil {
			return s, nil
		}
		errs = append(errs, err)
		if !errors.Is(err, errPortTaken) {
			break
		}
	}
	os.RemoveAll(dir)
	return nil, errors.Join(errs...)
}

// New is Start for a test: it fails tb (never skips it) when the server
// does not start, and stops the server when the test ends.
func New(tb testing.TB, extra ...string) *Server {
	tb.Helper()
	s, err := Start(extra...)
	return forTest(tb, s, err)
}

// forTest hands v, just started, to a test: it fails tb when err says the
// start failed, and stops v when the test ends.
func forTest[T interface{ Stop() error }](tb testing.TB, v T, err error) T {
	tb.Helper()
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := v.Stop(); err != nil {
			tb.Error(err)
		}
	})
	return v
}

var errPortTaken = errors.New("the port was taken")

// start starts the process and waits until it is ready.
func (s *Server) start() error {
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		return fmt.Errorf("redis-server on %s was stopped", s.Addr())
	}
	if s.cmd != nil {
		s.mu.Unlock()
		return fmt.Errorf("redis-server on %s is running", s.Addr())
	}
	logf, err := os.OpenFile(s.logPath(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		s.mu.Unlock()
		return err
	}
	fmt.Fprintf(logf, "--- redistest: redis-server %q\n", s.args)
	cmd := exec.Command("redis-server", s.args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = childAttr()
	err = cmd.Start()
	logf.Close() // the child has its own copy
	if err != nil {
		s.mu.Unlock()
		return fmt.Errorf("redis-server on %s: %w", s.Addr(), err)
	}
	done := make(chan struct{})
	go func() {
		cmd.Wait()
		close(done)
	}()
	s.cmd, s.done = cmd, done
	s.mu.Unlock()

	if err := awaitServer(s.Addr(), cmd.Process.Pid, done, StartTimeout); err != nil {
		s.Kill()
		log := s.logTail()
		if strings.Contains(log, "Address already in use") {
			err = fmt.Errorf("%w: %w", errPortTaken, err)
		}
		return fmt.Errorf("%w\nits log (%s) ends:\n%s", err, s.logPath(), log)
	}
	return nil
}

// awaitServer waits, up to limit, until the server on addr answers PING and
// says it is process pid. done closes when the process exits.
func awaitServer(addr string, pid int, done <-chan struct{}, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		err := probe(addr, pid)
		if err == nil {
			return nil
		}
		select {
		case <-done:
			return fmt.Errorf("redis-server on %s exited before it was ready: %w", addr, err)
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redis-server on %s was not ready within %v: %w", addr, limit, err)
		}
		time.Sleep(time.Millisecond) // a real server starting
	}
}

// probe sends PING and INFO server on a new connection of its own (a
// go-redis client, after a run of failed dials, dials only once a second,
// and would see the server late) and checks that the server answers PONG
// and that it is process pid, not another process on the same port.
func probe(addr string, pid int) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := io.WriteString(c, "*1\r\n$4\r\nPING\r\n*2\r\n$4\r\nINFO\r\n$6\r\nserver\r\n"); err != nil {
		return err
	}
	r := bufio.NewReader(c)
	line, err := r.ReadString('\n')
	if err != nil {
		return err
	}
	if line != "+PONG\r\n" {
		return fmt.Errorf("PING answered %q", strings.TrimSpace(line))
	}
	line, err = r.ReadString('\n')
	if err != nil {
		return err
	}
	n, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(line, "$")))
	if !strings.HasPrefix(line, "$") || err != nil || n < 0 {
		return fmt.Errorf("INFO server answered %q", strings.TrimSpace(line))
	}
	info := make([]byte, n)
	if _, err := io.ReadFull(r, info); err != nil {
		return err
	}
	if want := "process_id:" + strconv.Itoa(pid) + "\r\n"; !strings.Contains(string(info), want) {
		return fmt.Errorf("the server on %s is not process %d", addr, pid)
	}
	return nil
}

// freePort returns a loopback port that is free, and whose cluster bus port
// (the port plus 10000) is free too, when it looks.
func freePort() (int, error) {
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
	return 0, errors.New("no free loopback port pair (port and port+10000)")
}

// Addr returns the server's address, 127.0.0.1:port. It stays the same
// across Restart.
func (s *Server) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

// Port returns the server's port.
func (s *Server) Port() int { return s.port }

// Dir returns the server's own directory (its working directory, which
// holds its log), removed by Stop.
func (s *Server) Dir() string { return s.dir }

func (s *Server) logPath() string { return filepath.Join(s.dir, "redis-"+strconv.Itoa(s.port)+".log") }

// logTail returns the end of the server's log.
func (s *Server) logTail() string {
	b, err := os.ReadFile(s.logPath())
	if err != nil {
		return err.Error()
	}
	const keep = 4 << 10
	if len(b) > keep {
		b = b[len(b)-keep:]
	}
	return string(b)
}

// Client returns a new client of the server, with ContextTimeoutEnabled and
// the options then adjusted by edit (when not nil). The caller closes it.
func (s *Server) Client(edit func(*redis.Options)) *redis.Client {
	o := &redis.Options{Addr: s.Addr(), ContextTimeoutEnabled: true}
	if edit != nil {
		edit(o)
	}
	return redis.NewClient(o)
}

// Pid returns the server's process id, 0 when it is not running.
func (s *Server) Pid() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// Running reports whether the server's process has been started and has
// not exited (a paused server is running).
func (s *Server) Running() bool {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.mu.Unlock()
	if cmd == nil {
		return false
	}
	select {
	case <-done:
		return false
	default:
		return true
	}
}

// signal sends sig to the running process.
func (s *Server) signal(sig syscall.Signal) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return fmt.Errorf("redis-server on %s is not running", s.Addr())
	}
	if err := s.cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("redis-server on %s: %v: %w", s.Addr(), sig, err)
	}
	return nil
}

// Pause stops the process (SIGSTOP): the kernel still accepts connections
// on its port, but nothing is answered until Resume. It keeps its data.
func (s *Server) Pause() error { return s.signal(syscall.SIGSTOP) }

// Resume continues a paused process (SIGCONT).
func (s *Server) Resume() error { return s.signal(syscall.SIGCONT) }

// Kill crashes the server (SIGKILL) and returns once the process is gone:
// its port refuses connections and its data is lost. Killing a server that
// is not running does nothing. Restart starts it again.
func (s *Server) Kill() error {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.cmd, s.done = nil, nil
	s.mu.Unlock()
	if cmd == nil {
		return nil
	}
	cmd.Process.Kill() // an error here means it has exited already
	select {
	case <-done:
		return nil
	case <-time.After(stopTimeout):
		return fmt.Errorf("redis-server on %s (pid %d) did not exit on SIGKILL", s.Addr(), cmd.Process.Pid)
	}
}

// Restart kills the server if it is running, starts a new one on the same
// port with the same options, and returns once it is ready. The new server
// starts empty: nothing was persisted, so every key, and every script
// loaded, is gone.
func (s *Server) Restart() error {
	if err := s.Kill(); err != nil {
		return err
	}
	return s.start()
}

// Stop ends the server for good: it resumes a paused process, asks it to
// exit (SIGTERM), kills it if it has not within a few seconds, and removes
// its directory. Later calls do nothing.
func (s *Server) Stop() error {
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		return nil
	}
	s.stopped = true
	cmd, done := s.cmd, s.done
	s.mu.Unlock()
	var err error
	if cmd != nil {
		cmd.Process.Signal(syscall.SIGCONT) // a stopped process cannot act on SIGTERM
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
			s.mu.Lock()
			s.cmd, s.done = nil, nil
			s.mu.Unlock()
		case <-time.After(stopTimeout):
			err = s.Kill()
		}
	}
	return errors.Join(err, os.RemoveAll(s.dir))
}

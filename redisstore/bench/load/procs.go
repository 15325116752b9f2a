// Package load drives the example servers with real HTTP traffic, from a
// vegeta attacker in this process, and measures what they answer: the
// harness behind cmd/load and TestLoadSmoke. The server processes it
// starts listen on 127.0.0.1 only, and are stopped by Stop, which callers
// defer; the redis-server they share comes from redisstore's internal
// redistest package, as in redisstore's own tests.
package load

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// RepoRoot returns the directory of the core module, github.com/ratekit/ratelimit,
// found by walking up from the working directory.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		data, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && strings.HasPrefix(string(data), "module github.com/ratekit/ratelimit\n") {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("not inside github.com/ratekit/ratelimit")
		}
		dir = parent
	}
}

// Build runs go build -o out pkg in dir.
func Build(ctx context.Context, dir, pkg, out string) error {
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out, pkg)
	cmd.Dir = dir
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s in %s: %v\n%s", pkg, dir, err, b)
	}
	return nil
}

// Server is a server process started by StartServer.
type Server struct {
	Addr string // host:port it listens on
	URL  string // http://Addr
	cmd  *exec.Cmd
	done chan struct{}
}

var listening = regexp.MustCompile(`msg=listening addr=(\S+)`)

// StartServer starts bin with args plus -addr 127.0.0.1:0, and waits, up to
// 30 seconds, for the line it logs once it listens ("msg=listening
// addr=..."). Everything the server writes to stderr goes to logw.
func StartServer(bin string, args []string, logw io.Writer) (*Server, error) {
	cmd := exec.Command(bin, append([]string{"-addr", "127.0.0.1:0"}, args...)...)
	cmd.SysProcAttr = childAttr()
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stdout = logw
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	s := &Server{cmd: cmd, done: make(chan struct{})}
	addr := make(chan string, 1)
	go func() {
		defer close(s.done)
		sc := bufio.NewScanner(stderr)
		found := false
		for sc.Scan() {
			line := sc.Text()
			fmt.Fprintln(logw, line)
			if m := listening.FindStringSubmatch(line); m != nil && !found {
				found = true
				addr <- m[1]
			}
		}
		io.Copy(io.Discard, stderr)
	}()
	select {
	case a := <-addr:
		s.Addr, s.URL = a, "http://"+a
		return s, nil
	case <-s.done:
		cmd.Wait()
		return nil, fmt.Errorf("%s exited before it listened", bin)
	case <-time.After(30 * time.Second):
		s.Stop()
		return nil, fmt.Errorf("%s did not listen within 30 s", bin)
	}
}

// Pid returns the server's process id.
func (s *Server) Pid() int { return s.cmd.Process.Pid }

// Stop sends SIGTERM, waits up to 10 seconds for the server to exit, then
// kills it.
func (s *Server) Stop() {
	s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done: // stderr closed: the server exited
	case <-time.After(10 * time.Second):
		s.cmd.Process.Kill()
		<-s.done
	}
	s.cmd.Wait()
}

// RSS returns the resident set size of process pid in bytes, from
// /proc/pid/status (VmRSS).
func RSS(pid int) (int64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(rest)
			if len(f) != 2 || f[1] != "kB" {
				break
			}
			kb, err := strconv.ParseInt(f[0], 10, 64)
			return kb * 1024, err
		}
	}
	return 0, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
}

// ProcCPU returns the CPU time process pid has used, user and system, from
// /proc/pid/stat (in clock ticks, taken as the usual 100 a second).
func ProcCPU(pid int) (time.Duration, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name, in parentheses, may hold spaces: fields count
	// from after its closing parenthesis (state is field 3; utime 14 and
	// stime 15).
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: too short", pid)
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	return time.Duration(utime+stime) * 10 * time.Millisecond, nil
}

// SelfCPU returns the CPU time this process has used, user and system.
func SelfCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

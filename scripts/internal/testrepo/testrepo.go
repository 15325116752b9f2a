// Package testrepo makes small git repositories for the release tools'
// tests and runs commands in them.
package testrepo

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// New writes files, named by slash-separated paths, into a new temporary
// directory, commits them there as the first commit of a new git repository
// and returns the directory.
func New(t testing.TB, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, body := range files {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, args := range [][]string{
		{"init", "-q"},
		{"config", "user.name", "t"},
		{"config", "user.email", "t@example.com"},
		{"add", "-A"},
		{"commit", "-q", "-m", "first"},
	} {
		Must(t, dir, nil, "git", args...)
	}
	return dir
}

// Run runs name with args in dir, with env added to the environment, and
// returns its output and whether it succeeded. It fails the test if the
// command takes more than a minute.
func Run(t testing.TB, dir string, env []string, name string, args ...string) (string, bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), ctx.Err(), out)
	}
	return string(out), err == nil
}

// Must is Run for a command that has to succeed: it fails the test if the
// command fails.
func Must(t testing.TB, dir string, env []string, name string, args ...string) string {
	t.Helper()
	out, ok := Run(t, dir, env, name, args...)
	if !ok {
		t.Fatalf("%s %s failed:\n%s", name, strings.Join(args, " "), out)
	}
	return out
}

package scripts_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ratekit/ratelimit/scripts/internal/testrepo"
)

// releaseRepo is a repository of three modules, released once at v0.1.0:
// example.com/m at its root and example.com/m/sub, published, and
// example.com/m/bench, which requires both and is not.
var releaseRepo = map[string]string{
	"scripts/modules": "# dir published?\n.      published\nsub    published\nbench  unpublished\n",
	"go.mod":          "module example.com/m\n\ngo 1.21\n",
	"m.go":            "package m\n",
	"sub/go.mod":      "module example.com/m/sub\n\ngo 1.21\n\nrequire example.com/m v0.1.0\n",
	"sub/s.go":        "package sub\n",
	"bench/go.mod": "module example.com/m/bench\n\ngo 1.21\n\nrequire (\n\texample.com/m v0.1.0\n" +
		"\texample.com/m/sub v0.1.0\n\texample.com/other v1.0.0 // indirect\n)\n",
	"CHANGELOG.md": "# Changelog\n\n## v0.2.0\n\nSomething new.\n\n## v0.1.0\n\nThe first release.\n",
}

// newReleaseRepo commits releaseRepo with the release scripts and tags its
// modules v0.1.0.
func newReleaseRepo(t *testing.T) string {
	t.Helper()
	files := map[string]string{}
	for name, body := range releaseRepo {
		files[name] = body
	}
	for _, script := range []string{"release", "lib.sh"} {
		body, err := os.ReadFile(script)
		if err != nil {
			t.Fatal(err)
		}
		files["scripts/"+script] = string(body)
	}
	dir := testrepo.New(t, files)
	git(t, dir, "tag", "-a", "v0.1.0", "-m", "v0.1.0")
	git(t, dir, "tag", "-a", "sub/v0.1.0", "-m", "sub/v0.1.0")
	return dir
}

func git(t *testing.T, dir string, args ...string) string {
	t.Helper()
	return strings.TrimSpace(testrepo.Must(t, dir, nil, "git", args...))
}

// release runs scripts/release in dir with CI command ci.
func release(t *testing.T, dir, ci string, args ...string) (string, bool) {
	t.Helper()
	return testrepo.Run(t, dir, []string{"RELEASE_CI=" + ci}, "bash", append([]string{"scripts/release"}, args...)...)
}

// state is what a refused or dry release must leave as it was.
func state(t *testing.T, dir string) string {
	t.Helper()
	return git(t, dir, "rev-parse", "HEAD") + "\n" + git(t, dir, "tag", "--list") + "\n" +
		git(t, dir, "status", "--porcelain") + "\n" + git(t, dir, "worktree", "list", "--porcelain")
}

func TestReleaseRefuses(t *testing.T) {
	dir := newReleaseRepo(t)
	for _, tc := range []struct {
		name    string
		args    []string
		prepare func()
		want    string
	}{
		{"no version", nil, nil, "usage"},
		{"not a release version", []string{"v0.2"}, nil, "usage"},
		{"tagged already", []string{"v0.1.0"}, nil, "tag v0.1.0 exists already"},
		{"below the latest", []string{"v0.0.9"}, nil, "not above the latest release, v0.1.0"},
		{"no changelog section", []string{"v0.3.0"}, nil, `no section "## v0.3.0"`},
		{"a tag of one module", []string{"v0.2.0"}, func() { git(t, dir, "tag", "sub/v0.2.0") }, "tag sub/v0.2.0 exists already"},
		{"a changed file", []string{"v0.2.0"}, func() {
			git(t, dir, "tag", "-d", "sub/v0.2.0")
			if err := os.WriteFile(filepath.Join(dir, "m.go"), []byte("package m // changed\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}, "not clean"},
		{"a new file", []string{"v0.2.0"}, func() {
			git(t, dir, "checkout", "--", "m.go")
			if err := os.WriteFile(filepath.Join(dir, "new.go"), []byte("package m\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}, "not clean"},
		{"an unlisted module", []string{"v0.2.0"}, func() {
			if err := os.Remove(filepath.Join(dir, "new.go")); err != nil {
				t.Fatal(err)
			}
			if err := os.MkdirAll(filepath.Join(dir, "extra"), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "extra", "go.mod"), []byte("module example.com/m/extra\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}, "has a go.mod, but is not listed: extra"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.prepare != nil {
				tc.prepare()
			}
			before := state(t, dir)
			out, ok := release(t, dir, "echo CI RAN", tc.args...)
			if ok || !strings.Contains(out, tc.want) {
				t.Errorf("release %v: succeeded %v, output:\n%s\nwant a failure saying %q", tc.args, ok, out, tc.want)
			}
			if strings.Contains(out, "CI RAN") {
				t.Errorf("release %v ran CI", tc.args)
			}
			if after := state(t, dir); after != before {
				t.Errorf("release %v changed the repository:\n%s\nwas:\n%s", tc.args, after, before)
			}
		})
	}
}

func TestReleaseDryRun(t *testing.T) {
	dir := newReleaseRepo(t)
	before := state(t, dir)
	// CI sees the requirements as they will be tagged.
	out, ok := release(t, dir, `grep -h example.com/m sub/go.mod bench/go.mod`, "--dry-run", "v0.2.0")
	if !ok {
		t.Fatalf("dry run failed:\n%s", out)
	}
	for _, want := range []string{
		"require example.com/m v0.2.0\n", "\texample.com/m v0.2.0\n", "\texample.com/m/sub v0.2.0\n",
		"would commit sub/go.mod bench/go.mod and tag:\n   v0.2.0\n   sub/v0.2.0\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("dry run's output lacks %q:\n%s", want, out)
		}
	}
	if after := state(t, dir); after != before {
		t.Errorf("a dry run changed the repository:\n%s\nwas:\n%s", after, before)
	}
}

func TestReleaseCIFails(t *testing.T) {
	dir := newReleaseRepo(t)
	before := state(t, dir)
	out, ok := release(t, dir, "false", "v0.2.0")
	if ok || !strings.Contains(out, "CI failed; nothing is committed or tagged") {
		t.Errorf("release with failing CI: succeeded %v, output:\n%s", ok, out)
	}
	if after := state(t, dir); after != before {
		t.Errorf("a release whose CI failed changed the repository:\n%s\nwas:\n%s", after, before)
	}
}

func TestRelease(t *testing.T) {
	dir := newReleaseRepo(t)
	first := git(t, dir, "rev-parse", "HEAD")
	out, ok := release(t, dir, "true", "v0.2.0")
	if !ok {
		t.Fatalf("release failed:\n%s", out)
	}
	head := git(t, dir, "rev-parse", "HEAD")
	if head == first {
		t.Fatal("release made no commit")
	}
	if got := git(t, dir, "status", "--porcelain"); got != "" {
		t.Errorf("release left changes:\n%s", got)
	}
	if got := git(t, dir, "diff", "--name-only", first, head); got != "bench/go.mod\nsub/go.mod" {
		t.Errorf("the release commit changes %q, want the two go.mod files that require a published module", got)
	}
	for _, tc := range []struct{ file, want string }{
		{"sub/go.mod", "require example.com/m v0.2.0\n"},
		{"bench/go.mod", "\texample.com/m v0.2.0\n\texample.com/m/sub v0.2.0\n\texample.com/other v1.0.0 // indirect\n"},
	} {
		if got := git(t, dir, "show", head+":"+tc.file); !strings.Contains(got+"\n", tc.want) {
			t.Errorf("%s at the release:\n%s\nwant it to hold %q", tc.file, got, tc.want)
		}
	}
	if got := git(t, dir, "tag", "--points-at", head); got != "sub/v0.2.0\nv0.2.0" {
		t.Errorf("tags at the release commit: %q, want sub/v0.2.0 and v0.2.0 (and no tag for bench)", got)
	}
	if got := git(t, dir, "cat-file", "-t", "sub/v0.2.0"); got != "tag" {
		t.Errorf("sub/v0.2.0 is a %s, want an annotated tag", got)
	}
	if !strings.Contains(out, "git push origin HEAD v0.2.0 sub/v0.2.0") {
		t.Errorf("release does not say how to push:\n%s", out)
	}

	// Released again with nothing to change, it tags the commit as it is.
	if err := os.WriteFile(filepath.Join(dir, "CHANGELOG.md"), []byte("## v0.2.1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	git(t, dir, "commit", "-q", "-am", "changelog")
	out, ok = release(t, dir, "true", "v0.2.1")
	if !ok {
		t.Fatalf("second release failed:\n%s", out)
	}
	if got := git(t, dir, "tag", "--points-at", "HEAD"); got != "sub/v0.2.1\nv0.2.1" {
		t.Errorf("tags at the second release: %q", got)
	}
}

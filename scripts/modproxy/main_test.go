package main

import (
	"archive/zip"
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ratekit/ratelimit/scripts/internal/testrepo"
)

// repoFiles is a repository of two modules: example.com/m at its root and
// example.com/m/sub, which requires it and has no LICENSE of its own.
var repoFiles = map[string]string{
	"go.mod":               "module example.com/m\n\ngo 1.21\n",
	"LICENSE":              "the license\n",
	"m.go":                 "package m\n\n// Answer is the answer.\nconst Answer = 42\n",
	"sub/go.mod":           "module example.com/m/sub\n\ngo 1.21\n\nrequire example.com/m v1.2.3\n",
	"sub/s.go":             "package sub\n\nimport \"example.com/m\"\n\n// Twice is twice the answer.\nconst Twice = 2 * m.Answer\n",
	"sub/cmd/tool/main.go": "package main\n\nimport (\n\t\"fmt\"\n\n\t\"example.com/m/sub\"\n)\n\nfunc main() { fmt.Println(sub.Twice) }\n",
	"internal/x.go":        "package internal\n",
}

func zipNames(t *testing.T, file string) []string {
	t.Helper()
	zr, err := zip.OpenReader(file)
	if err != nil {
		t.Fatal(err)
	}
	defer zr.Close()
	var names []string
	for _, f := range zr.File {
		names = append(names, f.Name)
	}
	slices.Sort(names)
	return names
}

func TestLayout(t *testing.T) {
	repo := testrepo.New(t, repoFiles)
	out := t.TempDir()
	var stdout bytes.Buffer
	if err := run([]string{"-repo", repo, "-rev", "HEAD", "-version", "v1.2.3", "-out", out, ".", "sub"}, &stdout); err != nil {
		t.Fatal(err)
	}
	if got, want := stdout.String(), "example.com/m@v1.2.3\nexample.com/m/sub@v1.2.3\n"; got != want {
		t.Errorf("output %q, want %q", got, want)
	}

	root := filepath.Join(out, "example.com", "m", "@v")
	if got, want := zipNames(t, filepath.Join(root, "v1.2.3.zip")), []string{
		"example.com/m@v1.2.3/LICENSE", "example.com/m@v1.2.3/go.mod",
		"example.com/m@v1.2.3/internal/x.go", "example.com/m@v1.2.3/m.go",
	}; !slices.Equal(got, want) {
		t.Errorf("the root module's zip holds %q, want %q (no file of the nested module)", got, want)
	}
	sub := filepath.Join(out, "example.com", "m", "sub", "@v")
	if got, want := zipNames(t, filepath.Join(sub, "v1.2.3.zip")), []string{
		"example.com/m/sub@v1.2.3/LICENSE", "example.com/m/sub@v1.2.3/cmd/tool/main.go",
		"example.com/m/sub@v1.2.3/go.mod", "example.com/m/sub@v1.2.3/s.go",
	}; !slices.Equal(got, want) {
		t.Errorf("the nested module's zip holds %q, want %q (the root's LICENSE added)", got, want)
	}
	mod, err := os.ReadFile(filepath.Join(sub, "v1.2.3.mod"))
	if err != nil {
		t.Fatal(err)
	}
	if string(mod) != repoFiles["sub/go.mod"] {
		t.Errorf(".mod is %q, want the module's go.mod", mod)
	}
	var info struct{ Version string }
	data, err := os.ReadFile(filepath.Join(sub, "v1.2.3.info"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &info); err != nil || info.Version != "v1.2.3" {
		t.Errorf(".info is %s (%v), want Version v1.2.3", data, err)
	}

	// A second version joins the list, which stays in semantic order.
	if err := run([]string{"-repo", repo, "-version", "v1.10.0", "-out", out, "sub"}, &stdout); err != nil {
		t.Fatal(err)
	}
	if err := run([]string{"-repo", repo, "-version", "v1.2.3", "-out", out, "sub"}, &stdout); err != nil {
		t.Fatal(err)
	}
	list, err := os.ReadFile(filepath.Join(sub, "list"))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(list), "v1.2.3\nv1.10.0\n"; got != want {
		t.Errorf("list is %q, want %q", got, want)
	}
}

// TestGoGet fetches the published modules with the go command, offline, as a
// user would from their tags.
func TestGoGet(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command")
	}
	repo := testrepo.New(t, repoFiles)
	out := t.TempDir()
	if err := run([]string{"-repo", repo, "-version", "v1.2.3", "-out", out, ".", "sub"}, new(bytes.Buffer)); err != nil {
		t.Fatal(err)
	}
	cache := t.TempDir()
	env := []string{
		"GOPROXY=file://" + filepath.ToSlash(out) + ",off",
		"GONOSUMDB=example.com", "GOFLAGS=-mod=mod", "GOWORK=off", "GOTOOLCHAIN=local",
		"GOMODCACHE=" + cache,
	}
	// The module cache is made read-only; empty it so the temporary
	// directory can go.
	t.Cleanup(func() { testrepo.Must(t, cache, env, "go", "clean", "-modcache") })

	user := t.TempDir()
	testrepo.Must(t, user, env, "go", "mod", "init", "example.com/user")
	testrepo.Must(t, user, env, "go", "get", "example.com/m/sub@v1.2.3")
	main := "package main\n\nimport (\n\t\"fmt\"\n\n\t\"example.com/m/sub\"\n)\n\nfunc main() { fmt.Println(sub.Twice) }\n"
	if err := os.WriteFile(filepath.Join(user, "main.go"), []byte(main), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := testrepo.Must(t, user, env, "go", "run", "."); got != "84\n" {
		t.Errorf("the program printed %q, want 84", got)
	}
	if got := testrepo.Must(t, user, env, "go", "list", "-m", "example.com/m"); got != "example.com/m v1.2.3\n" {
		t.Errorf("the root module resolved as %q, want v1.2.3", got)
	}

	bin := t.TempDir()
	testrepo.Must(t, t.TempDir(), append(env, "GOBIN="+bin), "go", "install", "example.com/m/sub/cmd/tool@v1.2.3")
	if got := testrepo.Must(t, bin, nil, filepath.Join(bin, "tool")); got != "84\n" {
		t.Errorf("the installed tool printed %q, want 84", got)
	}
}

func TestRefuses(t *testing.T) {
	repo := testrepo.New(t, repoFiles)
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no version", []string{"-out", t.TempDir(), "."}, "usage"},
		{"not canonical", []string{"-version", "v1.2", "-out", t.TempDir(), "."}, "not a canonical"},
		{"build metadata", []string{"-version", "v1.2.3+x", "-out", t.TempDir(), "."}, "not a canonical"},
		{"major version", []string{"-version", "v2.0.0", "-out", t.TempDir(), "."}, "invalid version"},
		{"no module", []string{"-version", "v1.2.3", "-out", t.TempDir(), "internal"}, "no go.mod"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := run(append([]string{"-repo", repo}, tc.args...), new(bytes.Buffer))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one saying %q", err, tc.want)
			}
		})
	}
}

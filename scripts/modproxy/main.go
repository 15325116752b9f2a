// Command modproxy lays modules of a git repository out as a module proxy on
// disk, the layout GOPROXY=file://DIR reads:
//
//	DIR/<module>/@v/list
//	DIR/<module>/@v/<version>.info
//	DIR/<module>/@v/<version>.mod
//	DIR/<module>/@v/<version>.zip
//
// Each module's zip holds what the go command would fetch for it from a tag
// at the given revision: the files git would archive under the module's
// directory, less nested modules, with the repository's LICENSE added to a
// nested module that has none. So a fresh module that points GOPROXY at DIR
// meets the modules as a user meets them once they are tagged, without any
// of them leaving the machine.
//
// Usage:
//
//	modproxy -repo REPO -rev REV -version vX.Y.Z -out DIR MODDIR...
//
// REV is any git tree-ish (a commit, a tag, or a tree written from the
// working tree); each MODDIR is a module's directory relative to REPO, "."
// for the repository's root.
package main

import (
	"archive/zip"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	"golang.org/x/mod/semver"
	modzip "golang.org/x/mod/zip"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "modproxy:", err)
		os.Exit(1)
	}
}

func run(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("modproxy", flag.ContinueOnError)
	repo := fs.String("repo", ".", "the git repository's work tree")
	rev := fs.String("rev", "HEAD", "the git tree-ish to publish")
	version := fs.String("version", "", "the version to publish every module at (vX.Y.Z)")
	out := fs.String("out", "", "the proxy directory to write (created if missing)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *out == "" || *version == "" || fs.NArg() == 0 {
		return errors.New("usage: modproxy -repo REPO -rev REV -version vX.Y.Z -out DIR MODDIR [MODDIR ...]")
	}
	if !semver.IsValid(*version) || semver.Canonical(*version) != *version || semver.Build(*version) != "" {
		return fmt.Errorf("version %q is not a canonical semantic version such as v1.2.3", *version)
	}
	info, err := json.Marshal(struct {
		Version string
		Time    time.Time
	}{*version, time.Now().UTC().Truncate(time.Second)})
	if err != nil {
		return err
	}
	for _, dir := range fs.Args() {
		mod, err := publish(*repo, *rev, path.Clean(filepath.ToSlash(dir)), *version, info, *out)
		if err != nil {
			return fmt.Errorf("%s: %w", dir, err)
		}
		fmt.Fprintf(stdout, "%s@%s\n", mod, *version)
	}
	return nil
}

// publish writes the module in directory dir of repo at rev into the proxy
// at out, as version, and returns its path.
func publish(repo, rev, dir, version string, info []byte, out string) (string, error) {
	subdir := ""
	if dir != "." {
		subdir = dir
	}
	gomod, err := git(repo, "cat-file", "blob", rev+":"+path.Join(subdir, "go.mod"))
	if err != nil {
		return "", fmt.Errorf("no go.mod at %s: %w", rev, err)
	}
	modPath := modfile.ModulePath(gomod)
	if modPath == "" {
		return "", errors.New("go.mod names no module")
	}
	if err := module.Check(modPath, version); err != nil {
		return "", err
	}
	files, err := archived(repo, rev, subdir)
	if err != nil {
		return "", err
	}
	var zipped bytes.Buffer
	if err := modzip.Create(&zipped, module.Version{Path: modPath, Version: version}, files); err != nil {
		return "", err
	}

	escPath, err := module.EscapePath(modPath)
	if err != nil {
		return "", err
	}
	escVersion, err := module.EscapeVersion(version)
	if err != nil {
		return "", err
	}
	vdir := filepath.Join(out, filepath.FromSlash(escPath), "@v")
	if err := os.MkdirAll(vdir, 0o755); err != nil {
		return "", err
	}
	for ext, data := range map[string][]byte{".info": info, ".mod": gomod, ".zip": zipped.Bytes()} {
		if err := os.WriteFile(filepath.Join(vdir, escVersion+ext), data, 0o644); err != nil {
			return "", err
		}
	}
	return modPath, addToList(filepath.Join(vdir, "list"), version)
}

// addToList adds version to a proxy's list of a module's versions.
func addToList(list, version string) error {
	data, err := os.ReadFile(list)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	versions := strings.Fields(string(data))
	if slices.Contains(versions, version) {
		return nil
	}
	versions = append(versions, version)
	semver.Sort(versions)
	return os.WriteFile(list, []byte(strings.Join(versions, "\n")+"\n"), 0o644)
}

// archived returns the files git archives under subdir at rev, named
// relative to subdir, as the go command takes a module from a repository:
// a nested module without a LICENSE gets the repository's. modzip.Create
// leaves out the files of modules nested further down.
func archived(repo, rev, subdir string) ([]modzip.File, error) {
	// As the go command does, archive with line endings as committed.
	args := []string{"-c", "core.autocrlf=input", "-c", "core.eol=lf", "archive", "--format=zip", rev}
	if subdir != "" {
		args = append(args, subdir)
	}
	data, err := git(repo, args...)
	if err != nil {
		return nil, err
	}
	zr, err := zip.NewReader(bytes.NewReader(data), int64(len(data)))
	if err != nil {
		return nil, err
	}
	var files []modzip.File
	haveLicense := false
	for _, f := range zr.File {
		name := f.Name
		if subdir != "" {
			var ok bool
			if name, ok = strings.CutPrefix(name, subdir+"/"); !ok {
				continue
			}
		}
		if name == "" || strings.HasSuffix(name, "/") {
			continue
		}
		files = append(files, archivedFile{name, f})
		haveLicense = haveLicense || name == "LICENSE"
	}
	if !haveLicense && subdir != "" {
		if license, err := git(repo, "cat-file", "blob", rev+":LICENSE"); err == nil {
			files = append(files, dataFile{"LICENSE", license})
		}
	}
	return files, nil
}

func git(repo string, args ...string) ([]byte, error) {
	cmd := exec.Command("git", args...)
	cmd.Dir = repo
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("git %s: %w: %s", strings.Join(args, " "), err, bytes.TrimSpace(stderr.Bytes()))
	}
	return out, nil
}

// archivedFile is a file of a git archive.
type archivedFile struct {
	name string
	f    *zip.File
}

func (a archivedFile) Path() string                 { return a.name }
func (a archivedFile) Lstat() (os.FileInfo, error)  { return a.f.FileInfo(), nil }
func (a archivedFile) Open() (io.ReadCloser, error) { return a.f.Open() }

// dataFile is a file held in memory.
type dataFile struct {
	name string
	data []byte
}

func (d dataFile) Path() string                 { return d.name }
func (d dataFile) Lstat() (os.FileInfo, error)  { return dataInfo{d}, nil }
func (d dataFile) Open() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(d.data)), nil }

type dataInfo struct{ d dataFile }

func (i dataInfo) Name() string       { return path.Base(i.d.name) }
func (i dataInfo) Size() int64        { return int64(len(i.d.data)) }
func (i dataInfo) Mode() os.FileMode  { return 0o644 }
func (i dataInfo) ModTime() time.Time { return time.Time{} }
func (i dataInfo) IsDir() bool        { return false }
func (i dataInfo) Sys() any           { return nil }

package ratelimit_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"go/parser"
	"go/scanner"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ratekit/ratelimit"
)

// readmeBlock is one fenced code block of README.md.
type readmeBlock struct {
	lang string
	line int // the README line of the block's first line of code
	code string
}

// readmeBlocks returns every fenced code block of README.md, in order.
func readmeBlocks(t *testing.T) []readmeBlock {
	t.Helper()
	f, err := os.Open("README.md")
	require.NoError(t, err)
	defer f.Close()
	var (
		blocks []readmeBlock
		cur    *readmeBlock
		lines  []string
	)
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		switch {
		case cur == nil && strings.HasPrefix(line, "```"):
			cur = &readmeBlock{lang: strings.TrimSpace(strings.TrimPrefix(line, "```")), line: n + 1}
			lines = lines[:0]
		case cur != nil && strings.TrimSpace(line) == "```":
			cur.code = strings.Join(lines, "\n") + "\n"
			blocks = append(blocks, *cur)
			cur = nil
		case cur != nil:
			lines = append(lines, line)
		}
	}
	require.NoError(t, sc.Err())
	require.Nil(t, cur, "README.md: a code block opened at line %d is never closed", lineOf(cur))
	return blocks
}

func lineOf(b *readmeBlock) int {
	if b == nil {
		return 0
	}
	return b.line - 1
}

// readmeImports are the packages a README block may use without declaring
// them: the name a block refers to them by, and the import path.
var readmeImports = map[string]string{
	"context":   "context",
	"errors":    "errors",
	"fmt":       "fmt",
	"http":      "net/http",
	"httplimit": "github.com/ratekit/ratelimit/httplimit",
	"httptest":  "net/http/httptest",
	"io":        "io",
	"json":      "encoding/json",
	"log":       "log",
	"os":        "os",
	"ratelimit": "github.com/ratekit/ratelimit",
	"slog":      "log/slog",
	"strconv":   "strconv",
	"strings":   "strings",
	"sync":      "sync",
	"testing":   "testing",
	"time":      "time",
}

// usedImports returns the import paths of the packages code refers to as
// name.Something, leaving out comments and strings.
func usedImports(code string) []string {
	fset := token.NewFileSet()
	file := fset.AddFile("", fset.Base(), len(code))
	var s scanner.Scanner
	s.Init(file, []byte(code), nil, 0)
	seen := map[string]bool{}
	prev, prevLit := token.ILLEGAL, ""
	for {
		_, tok, lit := s.Scan()
		if tok == token.EOF {
			break
		}
		if tok == token.PERIOD && prev == token.IDENT {
			if path, ok := readmeImports[prevLit]; ok {
				seen[path] = true
			}
		}
		prev, prevLit = tok, lit
	}
	paths := make([]string, 0, len(seen))
	for p := range seen {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	return paths
}

// readmeProgram makes a Go source file of a README block. A block that is
// a whole file (it has a package clause) is taken as it is. Any other block
// gets a package clause and the imports it uses; a block of declarations
// (funcs, types) is then a file of its own, and a block of statements
// becomes the body of main. Line directives make the compiler report
// positions in README.md.
func readmeProgram(readme string, b readmeBlock) string {
	directive := fmt.Sprintf("//line %s:%d:1\n", readme, b.line)
	if regexp.MustCompile(`(?m)^package \w+`).MatchString(b.code) {
		return directive + b.code
	}
	var head strings.Builder
	head.WriteString("package main\n\nimport (\n")
	for _, p := range usedImports(b.code) {
		fmt.Fprintf(&head, "\t%q\n", p)
	}
	head.WriteString(")\n\n")
	decls := head.String() + directive + b.code
	if _, err := parser.ParseFile(token.NewFileSet(), "", decls, 0); err == nil {
		if !regexp.MustCompile(`(?m)^func main\(\)`).MatchString(b.code) {
			decls += "\n//line readme-wrapper:1\nfunc main() {}\n"
		}
		return decls
	}
	return head.String() + "func main() {\n" + directive + b.code + "}\n"
}

// TestReadmeGoBlocksCompile compiles and vets every ```go block of
// README.md, each as a program of its own in a temporary directory inside
// the module (so that the module's packages resolve), removed afterwards.
// The directory's name starts with "_", so no ./... pattern sees it.
func TestReadmeGoBlocksCompile(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command on PATH to compile README.md's code with")
	}

	dir, err := os.MkdirTemp(".", "_readme")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })

	readme, err := filepath.Abs("README.md")
	require.NoError(t, err)
	var pkgs []string
	for _, b := range readmeBlocks(t) {
		if b.lang != "go" {
			continue
		}
		pkg := filepath.Join(dir, fmt.Sprintf("line%d", b.line))
		require.NoError(t, os.Mkdir(pkg, 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(pkg, "main.go"), []byte(readmeProgram(readme, b)), 0o644))
		pkgs = append(pkgs, "./"+filepath.ToSlash(pkg))
	}
	require.NotEmpty(t, pkgs, "README.md has no go blocks")

	// go vet type-checks every block as the compiler does (an unused
	// variable or import is an error) and then runs its checks.
	out, err := exec.Command(goTool, append([]string{"vet"}, pkgs...)...).CombinedOutput()
	if err != nil {
		t.Errorf("README.md's go blocks do not compile or vet cleanly: %v\n%s", err, out)
	}
}

// TestReadmeGoBlocksSpendUnits checks that no README example spends a bare
// number: Check(1) is a thousandth of a request, the mistake the README
// warns about, so every cost in an example is written with ratelimit.Unit.
func TestReadmeGoBlocksSpendUnits(t *testing.T) {
	bare := regexp.MustCompile(`\.(Check|CheckContext|CheckWithin|Wait)\(([^()]*,\s*)?[0-9]+\s*[,)]`)
	for _, b := range readmeBlocks(t) {
		if b.lang != "go" {
			continue
		}
		for i, line := range strings.Split(b.code, "\n") {
			code, _, _ := strings.Cut(line, "//")
			assert.False(t, bare.MatchString(code), "README.md:%d spends a bare number, not a multiple of ratelimit.Unit: %s",
				b.line+i, strings.TrimSpace(line))
		}
	}
}

// TestReadmeJSONRules reads the README's ```json blocks: a block that is
// one document starting with "default" as a PlanSet, whose plans it builds;
// any other, line by line, as RuleSpecs, building each rule.
func TestReadmeJSONRules(t *testing.T) {
	n := 0
	for _, b := range readmeBlocks(t) {
		if b.lang != "json" {
			continue
		}
		if strings.HasPrefix(strings.TrimSpace(b.code), `{"default"`) || strings.Contains(b.code, "\n  \"default\"") {
			var set ratelimit.PlanSet
			if assert.NoError(t, json.Unmarshal([]byte(b.code), &set), "README.md:%d", b.line) {
				_, err := ratelimit.NewPlans(set, nil)
				assert.NoError(t, err, "README.md:%d", b.line)
			}
			continue
		}
		for i, line := range strings.Split(strings.TrimSpace(b.code), "\n") {
			var spec ratelimit.RuleSpec
			dec := json.NewDecoder(bytes.NewReader([]byte(line)))
			if assert.NoError(t, dec.Decode(&spec), "README.md:%d", b.line+i) {
				_, err := ratelimit.New(spec.Rule)
				assert.NoError(t, err, "README.md:%d", b.line+i)
				n++
			}
		}
	}
	assert.NotZero(t, n, "README.md has no JSON rules")
}

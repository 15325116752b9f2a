package ratelimit_test

import (
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

// docBlock is one code block of a Markdown document.
type docBlock struct {
	lang     string // the fence's language; "" for an indented block
	indented bool   // an indented code block, not a fenced one
	line     int    // the document's line of the block's first line of code
	code     string
}

// docFiles are the documents whose code and links the tests check: the
// README and every guide under docs/.
func docFiles(t *testing.T) []string {
	t.Helper()
	guides, err := filepath.Glob(filepath.Join("docs", "*.md"))
	require.NoError(t, err)
	sort.Strings(guides)
	return append([]string{"README.md"}, guides...)
}

// listItem matches the first line of a Markdown list item.
var listItem = regexp.MustCompile(`^\s*([-*+]|\d+[.)])\s`)

// docBlocks returns every code block of a Markdown document, in order:
// fenced blocks with their language, and indented blocks (four spaces or a
// tab after a blank line, outside a list).
func docBlocks(t *testing.T, path string) []docBlock {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	var (
		blocks   []docBlock
		cur      *docBlock
		lines    []string
		blank    = true // the line before was blank (or the start)
		inList   bool
		indented *docBlock
	)
	flush := func() {
		if indented != nil {
			indented.code = strings.Join(lines, "\n") + "\n"
			blocks = append(blocks, *indented)
			indented = nil
		}
	}
	for n, line := range strings.Split(string(data), "\n") {
		n++
		switch {
		case cur == nil && indented == nil && strings.HasPrefix(line, "```"):
			cur = &docBlock{lang: strings.TrimSpace(strings.TrimPrefix(line, "```")), line: n + 1}
			lines = lines[:0]
		case cur != nil && strings.TrimSpace(line) == "```":
			cur.code = strings.Join(lines, "\n") + "\n"
			blocks = append(blocks, *cur)
			cur = nil
		case cur != nil:
			lines = append(lines, line)
		case indented != nil:
			if strings.TrimSpace(line) == "" || strings.HasPrefix(line, "    ") || strings.HasPrefix(line, "\t") {
				lines = append(lines, line)
				continue
			}
			for len(lines) > 0 && strings.TrimSpace(lines[len(lines)-1]) == "" {
				lines = lines[:len(lines)-1]
			}
			flush()
			fallthrough
		default:
			code := strings.HasPrefix(line, "    ") || strings.HasPrefix(line, "\t")
			switch {
			case strings.TrimSpace(line) == "":
				blank = true
				continue
			case code && blank && !inList:
				indented = &docBlock{indented: true, line: n}
				lines = append(lines[:0], line)
			case listItem.MatchString(line):
				inList = true
			case !strings.HasPrefix(line, " "):
				inList = false
			}
			blank = false
		}
	}
	flush()
	require.Nil(t, cur, "%s: a code block opened at line %d is never closed", path, lineOf(cur))
	return blocks
}

// readmeBlocks returns every code block of README.md.
func readmeBlocks(t *testing.T) []docBlock { return docBlocks(t, "README.md") }

func lineOf(b *docBlock) int {
	if b == nil {
		return 0
	}
	return b.line - 1
}

// TestDocsCodeBlocksAreFenced checks that every code block of the README
// and the guides is fenced and names its language, so that no Go block
// escapes TestDocsGoBlocksCompile by being indented or unmarked.
func TestDocsCodeBlocksAreFenced(t *testing.T) {
	for _, path := range docFiles(t) {
		for _, b := range docBlocks(t, path) {
			if b.indented {
				t.Errorf("%s:%d: an indented code block; fence it and name its language (go, sh, text, ...)", path, b.line)
				continue
			}
			assert.NotEmpty(t, b.lang, "%s:%d: a fenced code block without a language", path, b.line-1)
		}
	}
}

// readmeImports are the packages a document's Go block may use without
// declaring them: the name a block refers to them by, and the import path.
var readmeImports = map[string]string{
	"context":       "context",
	"errors":        "errors",
	"fmt":           "fmt",
	"http":          "net/http",
	"httplimit":     "github.com/ratekit/ratelimit/httplimit",
	"httptest":      "net/http/httptest",
	"io":            "io",
	"json":          "encoding/json",
	"log":           "log",
	"os":            "os",
	"ratelimit":     "github.com/ratekit/ratelimit",
	"slog":          "log/slog",
	"strconv":       "strconv",
	"strings":       "strings",
	"sync":          "sync",
	"testing":       "testing",
	"time":          "time",
	"redis":         "github.com/redis/go-redis/v9",
	"redisstore":    "github.com/ratekit/ratelimit/redisstore",
	"grpc":          "google.golang.org/grpc",
	"insecure":      "google.golang.org/grpc/credentials/insecure",
	"grpclimit":     "github.com/ratekit/ratelimit/grpclimit",
	"prometheus":    "github.com/prometheus/client_golang/prometheus",
	"promhttp":      "github.com/prometheus/client_golang/prometheus/promhttp",
	"ratelimitprom": "github.com/ratekit/ratelimit/ratelimitprom",
	"ratelimitotel": "github.com/ratekit/ratelimit/ratelimitotel",
}

// nestedModules maps an import path prefix to the directory of the module
// of this repository a block that imports it is compiled in.
var nestedModules = map[string]string{
	"github.com/ratekit/ratelimit/redisstore":    "redisstore",
	"github.com/redis/go-redis/v9":               "redisstore",
	"github.com/ratekit/ratelimit/grpclimit":     "grpclimit",
	"google.golang.org/grpc":                     "grpclimit",
	"github.com/ratekit/ratelimit/ratelimitprom": "ratelimitprom",
	"github.com/prometheus/client_golang":        "ratelimitprom",
	"github.com/ratekit/ratelimit/ratelimitotel": "ratelimitotel",
}

// moduleOf returns the directory of the module a block is compiled in: "."
// for the core module, or the nested module of the packages it uses.
func moduleOf(code string) string {
	imports := usedImports(code)
	if regexp.MustCompile(`(?m)^package \w+`).MatchString(code) {
		imports = nil
		for _, m := range regexp.MustCompile(`"([^"]+)"`).FindAllStringSubmatch(code, -1) {
			imports = append(imports, m[1])
		}
	}
	for _, p := range imports {
		for prefix, dir := range nestedModules {
			if strings.HasPrefix(p, prefix) {
				return dir
			}
		}
	}
	return "."
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

// readmeProgram makes a Go source file of a document's block. A block that
// is a whole file (it has a package clause) is taken as it is. Any other
// block gets a package clause and the imports it uses; a block of
// declarations (funcs, types) is then a file of its own, and a block of
// statements becomes the body of main. Line directives make the compiler
// report positions in the document.
func readmeProgram(doc string, b docBlock) string {
	directive := fmt.Sprintf("//line %s:%d:1\n", doc, b.line)
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

// TestDocsGoBlocksCompile compiles and vets every ```go block of the
// README and the guides under docs/, each as a program of its own in a
// temporary directory inside the module whose packages it uses (the core
// module, or redisstore, grpclimit, ratelimitprom or ratelimitotel, so that
// their packages resolve), removed afterwards. The directories' names start
// with "_", so no ./... pattern sees them.
func TestDocsGoBlocksCompile(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command on PATH to compile the documents' code with")
	}

	pkgs := map[string][]string{} // module directory -> packages in it
	dirs := map[string]string{}   // module directory -> its temporary directory
	for _, path := range docFiles(t) {
		abs, err := filepath.Abs(path)
		require.NoError(t, err)
		for _, b := range docBlocks(t, path) {
			if b.lang != "go" {
				continue
			}
			mod := moduleOf(b.code)
			if dirs[mod] == "" {
				dir, err := os.MkdirTemp(mod, "_docs")
				require.NoError(t, err)
				t.Cleanup(func() { os.RemoveAll(dir) })
				dirs[mod] = dir
			}
			name := fmt.Sprintf("%s_line%d", strings.NewReplacer("/", "_", ".", "_").Replace(path), b.line)
			pkg := filepath.Join(dirs[mod], name)
			require.NoError(t, os.Mkdir(pkg, 0o755))
			require.NoError(t, os.WriteFile(filepath.Join(pkg, "main.go"), []byte(readmeProgram(abs, b)), 0o644))
			rel, err := filepath.Rel(mod, pkg)
			require.NoError(t, err)
			pkgs[mod] = append(pkgs[mod], "./"+filepath.ToSlash(rel))
		}
	}
	require.NotEmpty(t, pkgs["."], "README.md and docs/ have no go blocks")

	// go vet type-checks every block as the compiler does (an unused
	// variable or import is an error) and then runs its checks.
	for mod, list := range pkgs {
		cmd := exec.Command(goTool, append([]string{"vet"}, list...)...)
		cmd.Dir = mod
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("go blocks compiled in module %s do not compile or vet cleanly: %v\n%s", mod, err, out)
		}
	}
}

// TestDocsGoBlocksSpendUnits checks that no example spends a bare number:
// Check(1) is a thousandth of a request, the mistake the README warns
// about, so every cost in an example is written with ratelimit.Unit.
func TestDocsGoBlocksSpendUnits(t *testing.T) {
	bare := regexp.MustCompile(`\.(Check|CheckContext|CheckWithin|Wait)\(([^()]*,\s*)?[0-9]+\s*[,)]`)
	for _, path := range docFiles(t) {
		for _, b := range docBlocks(t, path) {
			if b.lang != "go" {
				continue
			}
			for i, line := range strings.Split(b.code, "\n") {
				code, _, _ := strings.Cut(line, "//")
				assert.False(t, bare.MatchString(code), "%s:%d spends a bare number, not a multiple of ratelimit.Unit: %s",
					path, b.line+i, strings.TrimSpace(line))
			}
		}
	}
}

// TestDocsJSONRules reads the documents' ```json blocks: a block that is
// one document starting with "default" as a PlanSet, whose plans it builds;
// any other, line by line, as RuleSpecs, building each rule.
func TestDocsJSONRules(t *testing.T) {
	n := 0
	for _, path := range docFiles(t) {
		for _, b := range docBlocks(t, path) {
			if b.lang != "json" {
				continue
			}
			if strings.HasPrefix(strings.TrimSpace(b.code), `{"default"`) || strings.Contains(b.code, "\n  \"default\"") {
				var set ratelimit.PlanSet
				if assert.NoError(t, json.Unmarshal([]byte(b.code), &set), "%s:%d", path, b.line) {
					_, err := ratelimit.NewPlans(set, nil)
					assert.NoError(t, err, "%s:%d", path, b.line)
				}
				continue
			}
			for i, line := range strings.Split(strings.TrimSpace(b.code), "\n") {
				var spec ratelimit.RuleSpec
				dec := json.NewDecoder(bytes.NewReader([]byte(line)))
				if assert.NoError(t, dec.Decode(&spec), "%s:%d", path, b.line+i) {
					_, err := ratelimit.New(spec.Rule)
					assert.NoError(t, err, "%s:%d", path, b.line+i)
					n++
				}
			}
		}
	}
	assert.NotZero(t, n, "README.md and docs/ have no JSON rules")
}

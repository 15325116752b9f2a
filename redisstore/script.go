package redisstore

import (
	_ "embed"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// The script is the fast path in doubles (fast.lua); the exact step, in
// pairs of doubles (pairs.lua) for the buckets and for the windows
// (limbs.lua, which divides and multiplies in limbs, arith.lua), inside a
// function of its own so that a check the fast path decides never builds
// it; and the step that tries the first and falls back to the second
// (step.lua). All are plain Lua 5.1 as Redis runs it: numbers are doubles,
// exact only up to 2^53.
//
// The sources name the table's codes and argument positions (see
// algorithms.go) ALG_<lua> and ARGV[ARG_<name>]; expandLua writes in the
// table's values as the script is assembled, so that the script runs with
// literals, as if written by hand. testdata holds each script assembled
// (see TestAssembledScripts; go generate rewrites them).
//
//go:generate go test -run TestAssembledScripts -update
var (
	//go:embed arith.lua
	arithLua string
	//go:embed fast.lua
	fastLua string
	//go:embed pairs.lua
	pairsLua string
	//go:embed limbs.lua
	limbsLua string
	//go:embed step.lua
	stepLua string

	stepSource = scriptSource("")
	stepScript = redis.NewScript(stepSource)
)

// scriptSource assembles the script; override is Lua run after the fast
// path is defined (tests use it to force a path).
func scriptSource(override string) string {
	return expandLua(fastLua + "\n" + override + "\n" + exactSource() + stepLua)
}

// exactSource is the exact path's function, exact(key, alg, old, tm):
// pairs.lua, then a call of each step's own exact function (the table's
// exact: pmeter for the buckets), and for the others limbs.lua, with their
// helpers (pairs.lua, arith.lua) inside it, so that a script built on every
// call builds them only when the fast path declines. It returns the step's
// four fields as four values, or an error reply (see step.lua).
func exactSource() string {
	return "local function exact(key, alg, old, tm)\n" + pairsLua + "\n" + exactDispatch() + arithLua + "\n" + limbsLua + "\nend\n"
}

// exactHoisted is exactSource with the helpers (pairs.lua and arith.lua)
// outside exact, for a library, which builds them once when it loads.
// What they share between calls (arith.lua's zero and one, and the
// arguments they keep read, ppCache) nothing writes to;
// TestExactSharedStateUntouched checks it.
func exactHoisted() string {
	return pairsLua + "\n" + arithLua + "\nppCache = {}\nlocal function exact(key, alg, old, tm)\n" + exactDispatch() + limbsLua + "\nend\n"
}

// exactDispatch calls each step's own exact function (the table's exact).
func exactDispatch() string {
	var b strings.Builder
	for _, st := range scriptSteps() {
		if st.exact != "" {
			b.WriteString("if alg == ALG_" + st.lua + " then return " + st.exact + "(key, old, tm) end\n")
		}
	}
	return b.String()
}

// layersLua decides one request on several keys (see NewComposite).
//
//go:embed layers.lua
var layersLua string

var (
	layersScriptSource = layersSource("")
	layersScript       = redis.NewScript(layersScriptSource)
)

// layersSource assembles the composite's script: layerStepSource, then
// layers.lua.
func layersSource(override string) string {
	return layerStepSource(override) + expandLua(layersLua)
}

// layerStepSource is the single-key step inside layerstep, whose ARGV and
// redis are its parameters, so that each layer runs it with its own
// arguments and with its write held back. override is Lua run after the
// fast path is defined, as for scriptSource. Its reply is the step's
// four fields as a list (see step.lua), which layers.lua reads by position,
// or the step's error reply.
func layerStepSource(override string) string {
	return expandLua("local function layerstep(ARGV, redis, key, old)\n" + fastLua + "\n" + override + "\n" + exactSource() +
		"local o, r, n, a = fast(key, ARGV[ARG_ALG], old, false)\n" +
		"if not o then\n  o, r, n, a = exact(key, ARGV[ARG_ALG], old, false)\n  if not a then return o end\nend\nreturn {o, r, n, a}\nend\n")
}

// scriptSteps returns the table's steps, each once, in the table's order.
func scriptSteps() []*scriptStep {
	var out []*scriptStep
	for _, a := range algorithms {
		if !containsStep(out, a.step) {
			out = append(out, a.step)
		}
	}
	return out
}

func containsStep(steps []*scriptStep, st *scriptStep) bool {
	for _, x := range steps {
		if x == st {
			return true
		}
	}
	return false
}

// luaName is a name the sources give a value of the table: ALG_<lua> a
// step's code, ARG_<name> an argument's position, SARG_<name> one of
// settle.lua's.
var luaName = regexp.MustCompile(`\b(?:ALG|ARG|SARG)_[A-Z][A-Z_]*\b`)

// expandLua writes the table's values in for the names src gives them (see
// luaName): a step's code as a Lua string, an argument's position (ARGV's
// index, from 1). A name the table does not have is left as it is, which
// TestScriptNamesExpanded finds (Redis would refuse it as a global only
// when a request reaches it).
func expandLua(src string) string {
	names := map[string]string{}
	for _, st := range scriptSteps() {
		names["ALG_"+st.lua] = "'" + st.code + "'"
		for _, sl := range slices.Concat(st.slots, st.bound) {
			names["ARG_"+sl.name] = strconv.Itoa(sl.at + 1)
		}
	}
	for _, sl := range stepHead {
		names["ARG_"+sl.name] = strconv.Itoa(sl.at + 1)
	}
	for _, sls := range [][]*slot{settleArgs, {settleWindow, settleRefused}} {
		for _, sl := range sls {
			names["SARG_"+sl.name] = strconv.Itoa(sl.at + 1)
		}
	}
	return luaName.ReplaceAllStringFunc(src, func(n string) string {
		if v, ok := names[n]; ok {
			return v
		}
		return n
	})
}

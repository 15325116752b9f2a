package redisstore

import (
	_ "embed"

	"github.com/redis/go-redis/v9"
)

// The script is the fast path in doubles (fast.lua); the exact step, in
// pairs of doubles for the buckets (pairs.lua) and in limbs for the
// windows (arith.lua and limbs.lua), inside a function of its own so that
// a check the fast path decides never builds it; and the step that tries
// the first and falls back to the second (step.lua). All are plain Lua 5.1
// as Redis runs it: numbers are doubles, exact only up to 2^53.
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

	stepScript = redis.NewScript(scriptSource(""))
)

// scriptSource assembles the script; override is Lua run after the fast
// path is defined (tests use it to force a path).
func scriptSource(override string) string {
	return fastLua + "\n" + override + "\nlocal function exact(key, alg, old, tm)\n" + pairsLua +
		"\nif alg == 'm' then return pmeter(key, old, tm) end\n" + arithLua + "\n" + limbsLua + "\nend\n" + stepLua
}

// layersLua decides one request on several keys (see NewComposite).
//
//go:embed layers.lua
var layersLua string

var layersScript = redis.NewScript(layersSource(""))

// layersSource assembles the composite's script: the single-key step
// inside layerstep, whose ARGV and redis are its parameters, so that each
// layer runs it with its own arguments and with its write held back, and
// then layers.lua. override is Lua run after the fast path is defined, as
// for scriptSource.
func layersSource(override string) string {
	return "local function layerstep(ARGV, redis, key, old)\n" + fastLua + "\n" + override +
		"\nlocal function exact(key, alg, old, tm)\n" + pairsLua +
		"\nif alg == 'm' then return pmeter(key, old, tm) end\n" + arithLua + "\n" + limbsLua + "\nend\n" +
		"local r = fast(key, ARGV[1], old, false)\nif r then return r end\nreturn exact(key, ARGV[1], old, false)\nend\n" + layersLua
}

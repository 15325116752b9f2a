package redisstore

import (
	"context"
	"crypto/sha1"
	_ "embed"
	"encoding/hex"
	"fmt"
	"strings"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// scriptRunner runs a script: a [redis.Script] (EVALSHA, then EVAL on
// NOSCRIPT), or a function of a library (FCALL).
type scriptRunner interface {
	Run(ctx context.Context, c redis.Scripter, keys []string, args ...any) *redis.Cmd
}

// stepLibrary is the check's step as a Redis Functions library (Redis 7):
// the same Lua as stepScript, with the functions of both paths built once
// when the library loads rather than on every call (see exactHoisted; a
// script, EVALSHA, builds the exact path's only on a call that takes it).
// ARGV is an upvalue the registered function sets before each step, so
// that the step's sources read it as the script's ARGV; the caches of the
// arguments each path has read (argCache, which keeps the seconds of the
// times the fast path reads too, see fast.lua; ppCache, see pairs.lua),
// the texts of the expiries the fast path writes (pxCache, see fast.lua)
// and those of the seconds after TIME's (secCache, see fast.lua) are set
// up once too, and last while the library stays loaded; so are the locals
// that hold the globals the step names on every check (see
// libraryGlobals).
// A single-key check sends its arguments packed (see packedText), and the
// library keeps each text it has read, as the table the step reads as its
// ARGV (packCache, see packed.lua); a check that sends one argument per
// slot (a leaky bucket's bounded on its Delay, see appendBound) is read as
// a script reads it.
// The library's name carries a digest of its source, so that stores of
// different versions on one server each find their own.
var stepLibrary, stepFunction = stepLibrarySource("")

// stepLibrarySource assembles the step's library; override is Lua run
// after the fast path is defined, as for scriptSource.
func stepLibrarySource(override string) (src, fn string) {
	return library("step", expandLua("local ARGV\n"+fastLua+"\nargCache, pxCache, secCache = {}, {}, {}\n"+override+"\n"+exactHoisted()+packedSource()),
		expandLua(packedStep+stepLua))
}

// packedLua reads a check's arguments sent packed (see packedText).
//
//go:embed packed.lua
var packedLua string

// packedStep is the start of the library's step: arguments sent packed
// (the text, and now unless it is the server's TIME) become the table the
// step reads as its ARGV; a text that is not well formed is an error, as
// an invalid argument is.
const packedStep = `if ARGV[3] == nil then
  ARGV = funpack(ARGV[1], ARGV[2] or '')
  if not ARGV then return redis.error_reply('RATELIMIT invalid argument') end
end
`

// packedSource is packed.lua with PACKED_ARITY, the count of each step's
// arguments (now included), written in.
func packedSource() string {
	var b strings.Builder
	b.WriteString("{")
	for i, st := range scriptSteps() {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s = %d", st.code, argRule+len(st.slots))
	}
	b.WriteString("}")
	return "\n" + strings.ReplaceAll(packedLua, "PACKED_ARITY", b.String())
}

// libraryGlobals are the globals a library's code names on every check:
// Lua looks a global up by its name in the globals table at each use, and
// a library function (string.byte) by its name in its table too, where a
// local the library's functions share (an upvalue) is read directly. The
// library keeps each in a local: a function of a library table is named
// in the source by its local (string.byte becomes string_byte). Those
// globals are not visible while a library loads, so the locals are set on
// its function's first call, from libGlobals, a function defined before
// the locals, whose names are still the globals. The table redis stays a
// global: the library names it as it loads (redis.register_function).
var libraryGlobals = []string{"string", "math", "table", "tonumber", "redis.call",
	"string.byte", "string.sub", "string.find", "string.match", "string.format", "math.fmod", "table.concat"}

// library returns the source of a library that registers body as a
// function named for name and the source's digest, after top (Lua run
// when the library loads), and that function's name.
func library(name, top, body string) (src, fn string) {
	var locals []string
	var rename []string
	for _, g := range libraryGlobals {
		l := strings.ReplaceAll(g, ".", "_")
		locals = append(locals, l)
		if l != g {
			rename = append(rename, g, l)
		}
	}
	r := strings.NewReplacer(rename...)
	all := strings.Join(locals, ", ")
	top = "local function libGlobals() return " + strings.Join(libraryGlobals, ", ") + " end\nlocal " + all + "\n" + r.Replace(top)
	body = "if not string then " + all + " = libGlobals() end\n" + r.Replace(body)
	sum := sha1.Sum([]byte(top + body))
	lib := "ratekit_" + hex.EncodeToString(sum[:6])
	fn = lib + "_" + name
	return "#!lua name=" + lib + "\n" + top + "\nredis.register_function('" + fn + "', function(KEYS, argv)\nARGV = argv\n" + body + "\nend)\n", fn
}

// functionCaller calls a library's function with FCALL, loading the
// library when the server does not have it (a new server, a restart
// without persistence, FUNCTION FLUSH), and falls back to the script for
// good on a server without Redis Functions (before 7.0, or one that
// refuses FUNCTION). Either way the step is the same Lua.
type functionCaller struct {
	lib, fn  string
	fallback *redis.Script
	noFCALL  atomic.Bool
}

// functionClient is what a client needs for FCALL.
type functionClient interface {
	FCall(ctx context.Context, function string, keys []string, args ...any) *redis.Cmd
	FunctionLoadReplace(ctx context.Context, code string) *redis.StringCmd
}

func (f *functionCaller) Run(ctx context.Context, c redis.Scripter, keys []string, args ...any) *redis.Cmd {
	if !f.calls(c) {
		return f.script(ctx, c, keys, args)
	}
	fc := c.(functionClient)
	cmd := fc.FCall(ctx, f.fn, keys, args...)
	err := cmd.Err()
	switch {
	case err == nil:
		return cmd
	case unknownCommand(err):
		// No FCALL: the command did not run.
		f.noFCALL.Store(true)
		return f.script(ctx, c, keys, args)
	case !strings.HasPrefix(err.Error(), "ERR Function not found"):
		return cmd
	}
	// The function did not run: load the library and call it again.
	if lerr := fc.FunctionLoadReplace(ctx, f.lib).Err(); lerr != nil {
		if unknownCommand(lerr) || strings.Contains(lerr.Error(), "NOPERM") {
			f.noFCALL.Store(true)
		}
		return f.script(ctx, c, keys, args)
	}
	return fc.FCall(ctx, f.fn, keys, args...)
}

// calls reports whether Run on c calls the function rather than the
// fallback script, as it does until a server without FCALL is found.
func (f *functionCaller) calls(c redis.Scripter) bool {
	_, ok := c.(functionClient)
	return ok && !f.noFCALL.Load()
}

// script runs the fallback with args, unpacked if a check sent them packed
// (see packedText): the script takes one argument per slot.
func (f *functionCaller) script(ctx context.Context, c redis.Scripter, keys []string, args []any) *redis.Cmd {
	if packedArgs(args) {
		args = unpackArgs(args)
	}
	return f.fallback.Run(ctx, c, keys, args...)
}

// unknownCommand reports a server that does not know the command sent.
func unknownCommand(err error) bool {
	return strings.Contains(err.Error(), "unknown command")
}

package redisstore

import (
	_ "embed"

	"github.com/redis/go-redis/v9"
)

// The script is the exact arithmetic followed by the step that uses it.
// Both are plain Lua 5.1 as Redis runs it: numbers are doubles, so every
// quantity that may pass 2^53 goes through the arithmetic in arith.lua.
var (
	//go:embed arith.lua
	arithLua string
	//go:embed step.lua
	stepLua string

	stepScript = redis.NewScript(arithLua + "\n" + stepLua)
)

package redisstore

import (
	_ "embed"

	"github.com/redis/go-redis/v9"
)

// The script is the exact limb arithmetic, the fast path in doubles, and
// the step that tries the fast path first and falls back to the limbs. All
// are plain Lua 5.1 as Redis runs it: numbers are doubles, exact only up
// to 2^53.
var (
	//go:embed arith.lua
	arithLua string
	//go:embed fast.lua
	fastLua string
	//go:embed step.lua
	stepLua string

	stepScript = redis.NewScript(arithLua + "\n" + fastLua + "\n" + stepLua)
)

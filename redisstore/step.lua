-- One check of one key, atomically: read the key's state, clamp now to the
-- state's latest instant, admit or deny exactly as the in-process limiter
-- does, write the new state with its expiry, and return what Go needs to
-- recompute and verify the Decision.
--
-- KEYS[1]  the key's state
-- ARGV[1]  algorithm: 'm' meter (token bucket, GCRA, leaky bucket),
--          'f' fixed window, 'c' sliding counter, 'l' sliding log,
--          's' sub-window counter
-- ARGV[2]  now in ns since the Unix epoch, or '' for the server's TIME
-- ARGV[3]  cost in milli-units
-- ARGV[4]  expiry margin in ms, added to the time until the state is as
--          good as a fresh key's
-- meter:   ARGV[5] n (the pace's milli-units), ARGV[6..7] the capacity's
--          span (ns, frac/n), ARGV[8..9] the cost's span (ns, frac/n)
-- windows: ARGV[5] window (ns), ARGV[6] capacity (milli-units); for the
--          sliding counter, ARGV[7] '1' counts a refused cost too
--          (CountRefused), each window's count capped at the capacity;
--          for the sub-window counter, ARGV[7] '1' or '0' (CountRefused,
--          each bucket's count capped at the capacity) and ARGV[8] the
--          number of buckets, from 1 to 60, which divides the window.
--          A composite's step passes '2' for a rule with CountRefused: it
--          never spends a refusal (see layers.lua)
--
-- Returns {old state or '', now used before clamping, new state, 1 if
-- admitted else 0}. A state that is not well formed, or that no sequence of
-- checks and settlements under the rule could have produced (a settlement
-- leaves at most twice the capacity in use), is an error reply and nothing
-- is written: the same states the Go side's decoder refuses. An empty
-- value is a fresh key, as the empty state is for the Machine.
--
-- The fast path (fast.lua) decides where its range check passes; else the
-- exact path, built only then, decides: pmeter (pairs.lua) for the buckets,
-- the limbs (arith.lua, limbs.lua) for the windows.

local key, alg = KEYS[1], ARGV[1]
-- TIME is read once: on 7.0 it moves while a script runs.
local tm = false
if ARGV[2] == '' then tm = redis.call('TIME') end
local old = redis.call('GET', key)
do
  local r = fast(key, alg, old, tm)
  if r then return r end
end
return exact(key, alg, old, tm)

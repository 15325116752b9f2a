-- One check of one key, atomically: read the key's state, clamp now to the
-- state's latest instant, admit or deny exactly as the in-process limiter
-- does, write the new state with its expiry, and return what Go needs to
-- recompute and verify the Decision.
--
-- KEYS[1]  the key's state
-- ARGV[ARG_ALG]  the algorithm's step: ALG_METER the buckets (token
--          bucket, GCRA, leaky bucket), ALG_FIXED fixed window,
--          ALG_COUNTER sliding counter, ALG_LOG sliding log, ALG_SUB
--          sub-window counter (the codes and positions are the table's,
--          algorithms.go, written in when the script is assembled)
-- ARGV[ARG_NOW]  now in ns since the Unix epoch, or '' for the server's TIME
-- ARGV[ARG_COST]  cost in milli-units
-- ARGV[ARG_MARGIN]  expiry margin in ms, added to the time until the state
--          is as good as a fresh key's
-- meter:   ARGV[ARG_PACE] n (the pace's milli-units), ARGV[ARG_TAU] and
--          ARGV[ARG_TAU_FRAC] the capacity's span (ns, frac/n),
--          ARGV[ARG_COST_SPAN] and ARGV[ARG_COST_FRAC] the cost's span
--          (ns, frac/n)
-- windows: ARGV[ARG_WINDOW] window (ns), ARGV[ARG_CAPACITY] capacity
--          (milli-units); for the sliding counter and the sub-window
--          counter, ARGV[ARG_REFUSED] '1' counts a refused cost too
--          (CountRefused), each window's or bucket's count capped at the
--          capacity, '0' not; for the sub-window counter, ARGV[ARG_BUCKETS]
--          the number of buckets, from 1 to 60, which divides the window.
--          A composite's step passes '2' for a rule with CountRefused: it
--          never spends a refusal (see layers.lua)
--
-- bounded: a meter's check bounded on its Delay (a leaky bucket's
--          CheckWithin) adds ARGV[ARG_MAX_DELAY] and ARGV[ARG_MAX_DELAY_FRAC],
--          the least queue ahead (ns, frac/n) at which an admission's Delay
--          is over the bound; a check without a bound does not send them.
--
-- Returns one text, four fields joined by commas: the old state or '', now
-- used before clamping, the new state, 1 if admitted else 0. Every field
-- is digits and spaces (a state the fast path or the exact path accepted,
-- or wrote), so no comma falls inside one. One text rather than a list of
-- four: the script makes no table for it, Redis writes one bulk reply
-- rather than a list and its four elements, and the client reads one
-- string. The paths themselves give the four fields as four values, not
-- a list (a composite's layerstep makes one of them), and the step joins
-- them, writing the code out itself: a number joined to a text is
-- converted with the C library's sprintf, which costs as much as the rest
-- of the joining.
--
-- A bounded check refuses an admission that finds that much queued ahead, with 2 for it, and writes nothing for a request it
-- does not admit: its new state is then ''. A state that is not well formed, or that no sequence of
-- checks and settlements under the rule could have produced (a settlement
-- leaves at most twice the capacity in use), is an error reply and nothing
-- is written: the same states the Go side's decoder refuses. An empty
-- value is a fresh key, as the empty state is for the Machine.
--
-- The fast path (fast.lua) decides where its range check passes; else the
-- exact path, built only then, decides: pmeter (pairs.lua) for the buckets,
-- limbs.lua for the windows, in pairs too, with limbs (arith.lua) only to
-- divide and multiply past 2^53.

local key, alg = KEYS[1], ARGV[ARG_ALG]
-- TIME is read once: on 7.0 it moves while a script runs.
local tm = false
if ARGV[ARG_NOW] == '' then tm = redis.call('TIME') end
local old = redis.call('GET', key)
local o, r, n, a = fast(key, alg, old, tm)
if not o then
  o, r, n, a = exact(key, alg, old, tm)
  if not a then return o end -- an error reply
end
return o .. ',' .. r .. ',' .. n .. (a == 1 and ',1' or a == 0 and ',0' or ',2')

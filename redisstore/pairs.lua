-- The exact step of the buckets (token bucket, GCRA, leaky bucket) for any
-- state, argument or time. Their step only adds, subtracts and compares
-- integers below 2^64, so each is kept as two doubles, h*10^9 + l with
-- 0 <= l < 10^9 (h below 2^35): every operation on such pairs is exact,
-- and none needs a table; the windows' step (limbs.lua) computes in such
-- pairs too. pmeter(key, old, tm) returns the step's four fields as four
-- values, as fast.lua's fast does (see step.lua), or an error reply. It is
-- defined inside the
-- script's exact function, built only when the fast path declines, and in
-- a library once, when it loads (see exactHoisted). As in fast.lua,
-- numbers and library functions are written out, not captured at load (a
-- library reads them through locals set on its first call, see
-- libraryGlobals).

-- pp reads a canonical decimal below 2^63 as a pair; nil if s is not one.
-- digits says s is known to hold digits only. The last nine digits are
-- summed from their bytes (fast.lua's fnano), which costs a fraction of
-- cutting them out and reading them with tonumber.
local function pp(s, digits)
  if type(s) ~= 'string' then return nil end
  local n = #s
  if n == 0 or n > 19 or (n > 1 and string.byte(s, 1) == 48) or (not digits and string.find(s, '%D'))
      or (n == 19 and s > '9223372036854775807') then
    return nil
  end
  if n <= 9 then return 0, tonumber(s) end
  return tonumber(string.sub(s, 1, n - 9)), fnano(s, n)
end

-- ppa reads an argument as pp does. A library (functions.go) sets ppCache
-- to a table once, when it loads, and ppa then keeps what it read for each
-- argument's text, as fast.lua's farg does (a rule's arguments are the
-- same on every check): at most 256 texts, then it starts afresh. A script
-- keeps nothing.
local ppCache, ppCached = false, 0
local function ppa(s)
  if ppCache then
    local v = ppCache[s]
    if v then return v[1], v[2] end
  end
  local h, l = pp(s)
  if ppCache and s then
    if ppCached >= 256 then ppCache, ppCached = {}, 0 end
    ppCache[s], ppCached = {h, l}, ppCached + 1
  end
  return h, l
end

local function pcmp(ah, al, bh, bl)
  if ah ~= bh then return ah < bh and -1 or 1 end
  if al ~= bl then return al < bl and -1 or 1 end
  return 0
end

local function padd(ah, al, bh, bl)
  local l = al + bl
  if l >= 1000000000 then return ah + bh + 1, l - 1000000000 end
  return ah + bh, l
end

-- psubp returns a - b for a >= b.
local function psubp(ah, al, bh, bl)
  local l = al - bl
  if l < 0 then return ah - bh - 1, l + 1000000000 end
  return ah - bh, l
end

-- pstr writes the pair (h, l) as a canonical decimal; zero, a state's
-- most common field past its first, without a conversion.
local function pstr(h, l)
  if h > 0 then return string.format('%d%09d', h, l) end
  if l == 0 then return '0' end
  return string.format('%d', l)
end

-- pnow returns now, TIME's reply tm or else the argument, clamped to
-- MaxTime (2^62 ns), and its canonical decimal; nil if the argument is not
-- a time. The text is the argument's own, or TIME's seconds and
-- microseconds then three zeros, where those are what pstr would write:
-- each number string.format converts costs as much as the rest of a step.
local function pnow(tm)
  local wh, wl, text
  if tm then
    wh, wl = tonumber(tm[1]), tonumber(tm[2]) * 1000
    if wh > 0 and #tm[2] == 6 then text = tm[1] .. tm[2] .. '000' end
  else
    text = ARGV[ARG_NOW]
    wh, wl = pp(text)
    if not wh then return nil end
  end
  if pcmp(wh, wl, 4611686018, 427387904) > 0 then return 4611686018, 427387904, '4611686018427387904' end
  return wh, wl, text or pstr(wh, wl)
end

-- pms returns a span below 2^64 ns in whole ms, rounded up.
local function pms(h, l)
  local r = l % 1000000
  local ms = h * 1000 + (l - r) / 1000000
  if r ~= 0 then ms = ms + 1 end
  return ms
end

-- pkeep writes new, a state, to key, to expire the pair (h, l) ns from
-- now in whole ms, rounded up, plus the check's margin, the pair (mh, ml)
-- ms as ppa read it.
local function pkeep(key, new, h, l, mh, ml)
  redis.call('SET', key, new, 'PX', string.format('%d', pms(h, l) + mh * 1000000000 + ml))
end

local function pfail(why)
  return redis.error_reply('RATELIMIT ' .. why)
end

local function pmeter(key, old, tm)
  local fail = pfail
  local ch, cl = ppa(ARGV[ARG_COST])
  local mh, ml = ppa(ARGV[ARG_MARGIN])
  local nh, nl = ppa(ARGV[ARG_PACE])
  local th, tl = ppa(ARGV[ARG_TAU])
  local fh, fl = ppa(ARGV[ARG_TAU_FRAC])
  local kh, kl = ppa(ARGV[ARG_COST_SPAN])
  local gh, gl = ppa(ARGV[ARG_COST_FRAC])
  if not (ch and mh and nh and th and fh and kh and gh) or (ch == 0 and cl == 0) then
    return fail('invalid argument')
  end
  -- A check bounded on its Delay: the least queue ahead that is too long
  -- (read with pp: it changes from check to check, so ppa does not keep it).
  local qh, ql, qfh, qfl = false, 0, 0, 0
  if ARGV[ARG_MAX_DELAY] then
    qh, ql = pp(ARGV[ARG_MAX_DELAY])
    qfh, qfl = pp(ARGV[ARG_MAX_DELAY_FRAC])
    if not (qh and qfh) then return fail('invalid argument') end
  end

  local wh, wl, reading = pnow(tm)
  if not wh then return fail('invalid argument') end
  -- The texts of the new state's fields, each kept from the reading or the
  -- state where the step leaves it as it was.
  local wt, st, rt = reading, '0', '0'

  -- The state "last t f", or "last", or nothing: a fresh key.
  local sh, sl, rh, rl = 0, 0, 0, 0
  if old and #old > 0 then
    -- Canonical decimals below 2^63 separated by single spaces, three of
    -- them or one (a fresh key's); anything else is not a state.
    local f1, f2, f3 = string.match(old, '^(%d+) (%d+) (%d+)$')
    if not f1 then f1 = string.match(old, '^%d+$') end
    if not f1 then return fail('invalid state') end
    local lh, ll = pp(f1, true)
    if not lh or pcmp(lh, ll, 4611686018, 427387904) > 0 then return fail('invalid state') end
    if pcmp(lh, ll, wh, wl) > 0 then wh, wl, wt = lh, ll, f1 end
    if f2 then
      sh, sl = pp(f2, true)
      rh, rl = pp(f3, true)
      if not (sh and rh) or pcmp(rh, rl, nh, nl) >= 0 then return fail('invalid state') end
      st, rt = f2, f3
    end
  else
    old = old or ''
  end

  -- The debt: how far the schedule runs ahead of now, never more than
  -- twice the capacity's span in a state the rule wrote (a settlement
  -- charges up to that).
  local dh, dl, eh, el = 0, 0, 0, 0
  if pcmp(sh, sl, wh, wl) >= 0 then
    dh, dl = psubp(sh, sl, wh, wl)
    eh, el = rh, rl
    local t2h, t2l = padd(th, tl, th, tl)
    local f2h, f2l = padd(fh, fl, fh, fl)
    if pcmp(f2h, f2l, nh, nl) >= 0 then
      t2h, t2l = padd(t2h, t2l, 0, 1)
      f2h, f2l = psubp(f2h, f2l, nh, nl)
    end
    local c = pcmp(dh, dl, t2h, t2l)
    if c > 0 or (c == 0 and pcmp(eh, el, f2h, f2l) > 0) then return fail('invalid state') end
  end
  local xh, xl = padd(dh, dl, kh, kl)
  local yh, yl = padd(eh, el, gh, gl)
  if pcmp(yh, yl, nh, nl) >= 0 then
    xh, xl = padd(xh, xl, 0, 1)
    yh, yl = psubp(yh, yl, nh, nl)
  end
  local admitted = 0
  local c = pcmp(xh, xl, th, tl)
  if c < 0 or (c == 0 and pcmp(yh, yl, fh, fl) <= 0) then
    local q = qh and pcmp(dh, dl, qh, ql)
    if q and (q > 0 or (q == 0 and pcmp(eh, el, qfh, qfl) >= 0)) then
      admitted = 2
    else
      admitted = 1
      dh, dl, eh, el = xh, xl, yh, yl
      st, rt = pstr(padd(wh, wl, xh, xl)), pstr(yh, yl)
    end
  end
  -- A bounded check writes only what it admits.
  if qh and admitted ~= 1 then return old, reading, '', admitted end
  if eh ~= 0 or el ~= 0 then dh, dl = padd(dh, dl, 0, 1) end
  local new = wt .. ' ' .. st .. ' ' .. rt

  -- Keep the state until it is as good as a fresh key's (the debt), plus
  -- the margin.
  pkeep(key, new, dh, dl, mh, ml)
  return old, reading, new, admitted
end

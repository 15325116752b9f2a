-- Exact integer arithmetic for Redis Lua, whose numbers are doubles (exact
-- only up to 2^53). A number is an array of limbs in base 10^7, least
-- significant first, with no zero limbs on top (zero is {0}). A product of
-- two limbs is below 10^14 and a limb-by-limb row with its carries stays
-- below 2^53, so every operation below is exact.

local B = 10000000
local floor = math.floor
local Z, ONE = {0}, {1}

-- parse reads a canonical decimal string (digits only, no leading zeros)
-- of at most maxd digits; nil if s is not one. digits says s is known to
-- hold digits only. Each limb is one tonumber of
-- a substring of seven digits, which costs about half of reading the
-- digits one byte at a time in Lua.
local byte, ssub, sfind, tonumber = string.byte, string.sub, string.find, tonumber
local function parse(s, maxd, digits)
  local n = #s
  if n == 0 or n > maxd or (n > 1 and byte(s, 1) == 48) or (not digits and sfind(s, '%D')) then
    return nil
  end
  if n <= 7 then return {tonumber(s)} end
  if n <= 14 then return {tonumber(ssub(s, n - 6)), tonumber(ssub(s, 1, n - 7))} end
  if n <= 21 then
    return {tonumber(ssub(s, n - 6)), tonumber(ssub(s, n - 13, n - 7)), tonumber(ssub(s, 1, n - 14))}
  end
  local a, k = {}, 1
  for i = n, 1, -7 do
    a[k], k = tonumber(ssub(s, i > 7 and i - 6 or 1, i)), k + 1
  end
  return a
end

-- N parses a field of a state or an argument: a canonical decimal below
-- 2^63 (an int64 that is not negative); digits as for parse.
local function N(s, digits)
  if type(s) ~= 'string' or (#s == 19 and s > '9223372036854775807') then
    return nil
  end
  return parse(s, 19, digits)
end

local sfmt = string.format
local function S(a)
  local n = #a
  if n == 1 then return sfmt('%d', a[1]) end
  if n == 2 then return sfmt('%d%07d', a[2], a[1]) end
  if n == 3 then return sfmt('%d%07d%07d', a[3], a[2], a[1]) end
  local t = {sfmt('%d', a[n])}
  for i = n - 1, 1, -1 do
    t[#t + 1] = sfmt('%07d', a[i])
  end
  return table.concat(t)
end

local function trim(a)
  local n = #a
  while n > 1 and a[n] == 0 do
    a[n] = nil
    n = n - 1
  end
  return a
end

local function cmp(a, b)
  local n, m = #a, #b
  if n ~= m then
    return n < m and -1 or 1
  end
  for i = n, 1, -1 do
    local x, y = a[i], b[i]
    if x ~= y then
      return x < y and -1 or 1
    end
  end
  return 0
end

local function iszero(a)
  return #a == 1 and a[1] == 0
end

local function add(a, b)
  local r, c = {}, 0
  local n = #a
  if #b > n then n = #b end
  for i = 1, n do
    local s = (a[i] or 0) + (b[i] or 0) + c
    if s >= B then
      r[i], c = s - B, 1
    else
      r[i], c = s, 0
    end
  end
  if c > 0 then r[n + 1] = c end
  return r
end

-- sub returns a - b for a >= b.
local function sub(a, b)
  local r, c = {}, 0
  for i = 1, #a do
    local s = a[i] - (b[i] or 0) - c
    if s < 0 then
      r[i], c = s + B, 1
    else
      r[i], c = s, 0
    end
  end
  return trim(r)
end

local function mul(a, b)
  local n, m = #a, #b
  local r = {}
  for i = 1, n + m do r[i] = 0 end
  for i = 1, n do
    local x, c = a[i], 0
    if x ~= 0 then
      for j = 1, m do
        local s = r[i + j - 1] + x * b[j] + c -- < 2^53
        c = floor(s / B)
        r[i + j - 1] = s - c * B
      end
      r[i + m] = c -- untouched by earlier rows
    end
  end
  return trim(r)
end

-- muls returns a * k for a whole 0 <= k < B.
local function muls(a, k)
  local r, c = {}, 0
  for i = 1, #a do
    local s = a[i] * k + c
    c = floor(s / B)
    r[i] = s - c * B
  end
  if c > 0 then r[#a + 1] = c end
  return trim(r)
end

-- approx is a close double for a, used only to guess quotient limbs.
local function approx(a)
  local x = 0
  for i = #a, 1, -1 do x = x * B + a[i] end
  return x
end

-- shl returns a * B^k.
local function shl(a, k)
  if k == 0 or iszero(a) then return a end
  local r = {}
  for i = 1, k do r[i] = 0 end
  for i = 1, #a do r[k + i] = a[i] end
  return r
end

-- divmod returns floor(a/d) and a mod d, for d > 0, by long division with
-- one limb of the quotient per step. Each limb is guessed from doubles (off
-- by at most one or two) and then corrected exactly.
local function divmod(a, d)
  if cmp(a, d) < 0 then return Z, a end
  local q, r, dd = {}, a, approx(d)
  for k = #a - #d, 0, -1 do
    local dk = shl(d, k)
    local g = floor(approx(r) / (dd * B ^ k))
    if g > B - 1 then g = B - 1 elseif g < 0 then g = 0 end
    local t = muls(dk, g)
    while cmp(t, r) > 0 do
      g = g - 1
      t = sub(t, dk)
    end
    r = sub(r, t)
    while cmp(r, dk) >= 0 do
      g = g + 1
      r = sub(r, dk)
    end
    q[k + 1] = g
  end
  return trim(q), r
end

-- fromtime returns the instant TIME replied, sec*10^9 + usec*10^3 ns, in
-- limbs: usec*10^3 = lo + hi*10^7 with lo = (usec mod 10^4)*10^3 and hi <
-- 100, and sec*100 + hi is below 2^53 (for sec below 9e13).
local function fromtime(secs, usecs)
  local sec, usec = tonumber(secs), tonumber(usecs)
  local lo = (usec % 10000) * 1000
  local c = sec * 100 + (usec - usec % 10000) / 10000
  local l2 = math.fmod(c, B)
  return trim({lo, l2, (c - l2) / B})
end

-- ceilms returns ceil(a / 10^6), for a below 2^63, as a decimal string:
-- a nanosecond span in whole milliseconds, rounded up.
local function ceilms(a)
  local l1, l2, l3 = a[1], a[2] or 0, a[3] or 0
  local r = l1 % 1000000
  local ms = l3 * 100000000 + l2 * 10 + (l1 - r) / 1000000 -- < 2^53
  if r ~= 0 then ms = ms + 1 end
  return ms
end

local function max(a, b)
  if cmp(a, b) < 0 then return b end
  return a
end

-- Refund and Settle of a bucket rule (token bucket, GCRA, leaky bucket), a
-- fixed window or a sliding counter on one key, computed here and written in the same script, so that checks
-- running at the same time never make it retry: the arithmetic of the
-- rule's Machine (Refund, Settle) in exact limbs (arith.lua, which the
-- script defines before this file). The Go side runs the Machine on the
-- state this script read, at the instant it read, and checks that it
-- gives back, charges and writes exactly what this script did.
--
-- KEYS[1]   the key's state, "last t f" (see the Machine's encoding)
-- ARGV[1]   now in ns since the Unix epoch, or '' for the server's TIME
-- ARGV[2]   'r' refund, 's' settle
-- ARGV[3]   refund: the cost to give back, at most the capacity;
--           settle: the cost charged, from 1 to the capacity (milli-units)
-- ARGV[4]   settle: the actual cost, above 0 (milli-units)
-- ARGV[5]   at: the admitting Decision's At, at least 0 (ns)
-- ARGV[6]   expiry margin in ms
-- ARGV[7], ARGV[8] the pace, n milli-units per p ns;
--           ARGV[9], ARGV[10] the capacity's span tau
--           (ns, frac/n); ARGV[11] the capacity (milli-units).
--           For a window rule, ARGV[7] (in the pace's place) is
--           the window (ns), ARGV[8] (in the period's) '1' if
--           it has CountRefused, and the capacity's span is unused
-- ARGV[12], ARGV[13] settle: the span of the cost
--           charged (ns, frac/n)
-- ARGV[14]  the rule's step (algorithms.go): 'm' a bucket
--           rule, 'f' a fixed window, 'c' a sliding counter
--
-- Returns {old state or '', now used before clamping, state written or '',
-- given back (refund) or the cost as settled (settle), the expiry set in
-- ms or ''}. A state that is not well formed, more than twice the
-- capacity's span in debt, or (a window) counting more than twice the
-- capacity or a window later than now, is an error reply and nothing is written: the
-- states the Machine refuses. A key Redis does not hold gives nothing back
-- and is not created, but for a settlement that charges.

local function fail(why)
  return redis.error_reply('RATELIMIT ' .. why)
end

local mode = ARGV[2]
local c, act, at, margin = N(ARGV[3]), N(ARGV[4]), N(ARGV[5]), N(ARGV[6])
local alg = ARGV[14]
local n, p, tau, tauf, cap = N(ARGV[7]), N(ARGV[8]), N(ARGV[9]), N(ARGV[10]), N(ARGV[11])
local counts = alg == 'c' and ARGV[8] == '1'
if alg == 'f' or alg == 'c' then p, tau, tauf = ONE, Z, Z end
if not (c and at and margin and n and p and tau and tauf and cap) or iszero(c) or iszero(n) or iszero(p)
    or (mode == 's' and not (act and not iszero(act))) or (mode ~= 's' and mode ~= 'r')
    or (alg ~= 'm' and alg ~= 'f' and alg ~= 'c') then
  return fail('invalid argument')
end

local MAXT = {7387904, 8601842, 46116} -- 2^62 ns: MaxTime
local MAXTAT = N('9223372036854775807')
local now
if ARGV[1] == '' then
  local tm = redis.call('TIME')
  now = fromtime(tm[1], tm[2])
else
  now = N(ARGV[1])
  if not now then return fail('invalid argument') end
end
if cmp(now, MAXT) > 0 then now = MAXT end
local reading = S(now)

local old = redis.pcall('GET', KEYS[1])
if type(old) == 'table' then return fail('invalid state: ' .. tostring(old.err)) end
old = old or ''

-- A fresh key: nothing to give back.
local charging = mode == 's' and cmp(act, c) > 0
if old == '' and not charging then
  local x = '0'
  if mode == 's' then x = S(c) end
  return {'', reading, '', x, ''}
end

-- state reads the state read as "last" and k fields more, or "last" alone
-- (a reset key's), raising now to last, and returns the k fields, as many
-- zeros for "last" alone; nil for anything else.
local function state(k)
  local f = {}
  if old ~= '' then
    f = {string.match(old, '^(%d+)' .. string.rep(' (%d+)', k) .. '$')}
    if #f == 0 then f = {string.match(old, '^(%d+)$')} end
    local last = f[1] and N(f[1], true)
    if not last or cmp(last, MAXT) > 0 then return nil end
    if cmp(last, now) > 0 then now = last end
  end
  local out = {}
  for i = 1, k do
    out[i] = Z
    if f[i + 1] then
      out[i] = N(f[i + 1], true)
      if not out[i] then return nil end
    end
  end
  return out
end

-- finish writes new, with the expiry px ms, or keeping the key's if px is
-- '', unless it is the state read, and returns the reply for the amount x.
local function finish(new, x, px)
  if new == old then return {old, reading, '', S(x), ''} end
  if px ~= '' then
    redis.call('SET', KEYS[1], new, 'PX', px)
  else
    redis.call('SET', KEYS[1], new, 'KEEPTTL')
  end
  return {old, reading, new, S(x), px}
end

-- A fixed window: "last win count", n the window.
if alg == 'f' then
  local f = state(2)
  if not f or cmp(f[2], add(cap, cap)) > 0 then return fail('invalid state') end
  local sw, sc = f[1], f[2]
  local win, e = divmod(now, n)
  if cmp(sw, win) > 0 then return fail('invalid state') end
  local count = Z
  if cmp(sw, win) == 0 then count = sc end
  local x, px = nil, ''
  -- refund gives back up to cost of what was admitted at at, in this window.
  local function frefund(cost)
    local a = at
    if cmp(a, now) > 0 then a = now end
    if iszero(count) or cmp(divmod(a, n), win) ~= 0 then return Z end
    local g = cost
    if cmp(count, g) < 0 then g = count end
    sw, sc = win, sub(count, g)
    return g
  end
  if mode == 'r' then
    x = frefund(c)
  elseif charging then
    local g = Z
    local c2 = add(cap, cap)
    if cmp(count, c2) < 0 then
      g = sub(act, c)
      local room = sub(c2, count)
      if cmp(room, g) < 0 then g = room end
      sw, sc = win, add(count, g)
    end
    x = add(c, g)
    -- The Decision's ResetAfter is the time left in the window.
    local ms = add(N(string.format('%d', ceilms(sub(n, e)))), margin)
    if cmp(ms, MAXTAT) > 0 then ms = MAXTAT end
    px = S(ms)
  elseif cmp(act, c) == 0 then
    x = c
  else
    x = sub(c, frefund(sub(c, act)))
  end
  local new = S(now) .. ' ' .. S(sw) .. ' ' .. S(sc)
  return finish(new, x, px)
end

-- A sliding counter: "last win prev cur", n the window.
if alg == 'c' then
  local f = state(3)
  if not f or cmp(f[2], add(cap, cap)) > 0 or cmp(f[3], add(cap, cap)) > 0 then return fail('invalid state') end
  local sw, sp, sc = f[1], f[2], f[3]
  local win, e = divmod(now, n)
  if cmp(sw, win) > 0 then return fail('invalid state') end
  local prev, cur = Z, Z
  if cmp(sw, win) == 0 then
    prev, cur = sp, sc
  elseif cmp(add(sw, ONE), win) == 0 then
    prev = sc
  end
  local left = sub(n, e)
  -- crefund gives back up to cost of what was admitted at at, in this
  -- window or the one before.
  local function crefund(cost)
    local a = at
    if cmp(a, now) > 0 then a = now end
    local aw = divmod(a, n)
    local g = cost
    if cmp(aw, win) == 0 then
      if cmp(cur, g) < 0 then g = cur end
      cur = sub(cur, g)
    elseif cmp(add(aw, ONE), win) == 0 then
      if cmp(prev, g) < 0 then g = prev end
      prev = sub(prev, g)
    else
      g = Z
    end
    if not iszero(g) then sw, sp, sc = win, prev, cur end
    return g
  end
  local x, px = nil, ''
  if mode == 'r' then
    x = crefund(c)
  elseif charging then
    -- In use: the estimate at now, rounded up.
    local q, r = divmod(mul(prev, left), n)
    if not iszero(r) then q = add(q, ONE) end
    local spent, c2, g = add(q, cur), add(cap, cap), Z
    if cmp(spent, c2) < 0 then
      g = sub(act, c)
      local room = sub(c2, spent)
      if cmp(room, g) < 0 then g = room end
      cur = add(cur, g)
      sw, sp, sc = win, prev, cur
    end
    x = add(c, g)
    -- The Decision's ResetAfter: a peek of the cost charged, after.
    local reset = Z
    if not iszero(cur) or counts then
      reset = add(left, n)
    elseif not iszero(prev) then
      reset = left
      if cmp(c, cap) <= 0 and cmp(mul(prev, left), mul(sub(cap, c), n)) <= 0 then reset = add(left, n) end
    else
      reset = add(left, n)
    end
    local ms = add(N(string.format('%d', ceilms(reset))), margin)
    if cmp(ms, MAXTAT) > 0 then ms = MAXTAT end
    px = S(ms)
  elseif cmp(act, c) == 0 then
    x = c
  else
    x = sub(c, crefund(sub(c, act)))
  end
  local new = S(now) .. ' ' .. S(sw) .. ' ' .. S(sp) .. ' ' .. S(sc)
  return finish(new, x, px)
end

-- A bucket rule: "last t f".
local f = state(2)
if not f or cmp(f[2], n) >= 0 then return fail('invalid state') end
local ts, fr = f[1], f[2]

-- The debt: how far the schedule runs ahead of now, at most 2 tau.
local dn, df = Z, Z
if cmp(ts, now) >= 0 then
  dn, df = sub(ts, now), fr
  local t2, f2 = add(tau, tau), add(tauf, tauf)
  if cmp(f2, n) >= 0 then t2, f2 = add(t2, ONE), sub(f2, n) end
  local k = cmp(dn, t2)
  if k > 0 or (k == 0 and cmp(df, f2) > 0) then return fail('invalid state') end
end

-- milli(ns, frac) is (ns*n + frac)/p, rounded down, and whether it is exact.
local function milli(ns, frac)
  local q, r = divmod(add(mul(ns, n), frac), p)
  return q, iszero(r)
end

-- span(g) is the time g milli-units take: (g*p)/n ns plus frac/n.
local function span(g)
  return divmod(mul(g, p), n)
end

-- refund gives back up to cost milli-units of what was admitted at at.
local function refund(cost)
  local g, a = cost, at
  if cmp(a, now) > 0 then a = now end
  local held = milli(dn, df)
  if cmp(held, g) < 0 then g = held end
  local e = sub(now, a)
  if not iszero(e) then
    if cmp(e, tau) > 0 then return Z end
    local q, exact = milli(e, Z)
    if not exact then q = add(q, ONE) end
    if cmp(q, cost) >= 0 then return Z end
    local left = sub(cost, q)
    if cmp(left, g) < 0 then g = left end
  end
  if iszero(g) then return Z end
  local sn, sf = span(g)
  if cmp(fr, sf) < 0 then
    ts, fr = sub(ts, add(sn, ONE)), sub(add(fr, n), sf)
  else
    ts, fr = sub(ts, sn), sub(fr, sf)
  end
  return g
end

-- charge spends up to extra milli-units at now, into a debt of at most
-- twice the capacity in use, never moving the schedule past MAXTAT.
local function charge(extra)
  local spent, exact = milli(dn, df)
  if not exact then spent = add(spent, ONE) end
  local c2 = add(cap, cap)
  if cmp(spent, c2) >= 0 then return Z end
  local g = sub(c2, spent)
  if cmp(extra, g) < 0 then g = extra end
  if iszero(g) then return Z end
  if cmp(ts, now) < 0 then ts, fr = now, Z end
  local room
  if cmp(ts, MAXTAT) == 0 then
    room = Z
  elseif iszero(fr) then
    room = milli(sub(MAXTAT, ts), Z)
  else
    room = milli(sub(sub(MAXTAT, ts), ONE), sub(n, fr))
  end
  if cmp(room, g) < 0 then
    g = room
    if iszero(g) then return Z end
  end
  local sn, sf = span(g)
  ts, fr = add(ts, sn), add(fr, sf)
  if cmp(fr, n) >= 0 then ts, fr = add(ts, ONE), sub(fr, n) end
  return g
end

local x, px = nil, ''
if mode == 'r' then
  x = refund(c)
elseif charging then
  x = add(c, charge(sub(act, c)))
  -- The expiry is the Decision's ResetAfter (a peek of the cost charged
  -- after the charge) plus the margin, as a check sets it.
  local dn2, df2 = Z, Z
  if cmp(ts, now) >= 0 then dn2, df2 = sub(ts, now), fr end
  local cn, cf = N(ARGV[12]), N(ARGV[13])
  if not (cn and cf) then return fail('invalid argument') end
  local nn, nf = add(dn2, cn), add(df2, cf)
  if cmp(nf, n) >= 0 then nn, nf = add(nn, ONE), sub(nf, n) end
  local k = cmp(nn, tau)
  if k < 0 or (k == 0 and cmp(nf, tauf) <= 0) then dn2, df2 = nn, nf end
  if not iszero(df2) then dn2 = add(dn2, ONE) end
  local ms = add(N(string.format('%d', ceilms(dn2))), margin)
  if cmp(ms, MAXTAT) > 0 then ms = MAXTAT end
  px = S(ms)
elseif cmp(act, c) == 0 then
  x = c
else
  x = sub(c, refund(sub(c, act)))
end

local new = S(now) .. ' ' .. S(ts) .. ' ' .. S(fr)
return finish(new, x, px)

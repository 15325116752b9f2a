-- Exact integer arithmetic for Redis Lua, whose numbers are doubles (exact
-- only up to 2^53). A number is an array of limbs in base 10^7, least
-- significant first, with no zero limbs on top (zero is {0}). A product of
-- two limbs is below 10^14 and a limb-by-limb row with its carries stays
-- below 2^53, so every operation below is exact.
--
-- A library (functions.go) runs this file once, when it loads, where the
-- string and math libraries cannot be read: they are named inside the
-- functions, not captured at load (the library reads them through locals
-- it sets on its first call, see libraryGlobals). Zero and one are shared
-- by every call there, so nothing may write to a number it did not make
-- (trim writes only to results of its own).

local B = 10000000
local Z, ONE = {0}, {1}

-- parse reads a canonical decimal string (digits only, no leading zeros)
-- of at most maxd digits; nil if s is not one. digits says s is known to
-- hold digits only. Each limb is one tonumber of
-- a substring of seven digits, which costs about half of reading the
-- digits one byte at a time in Lua.
local function parse(s, maxd, digits)
  local n = #s
  if n == 0 or n > maxd or (n > 1 and string.byte(s, 1) == 48) or (not digits and string.find(s, '%D')) then
    return nil
  end
  if n <= 7 then return {tonumber(s)} end
  if n <= 14 then return {tonumber(string.sub(s, n - 6)), tonumber(string.sub(s, 1, n - 7))} end
  if n <= 21 then
    return {tonumber(string.sub(s, n - 6)), tonumber(string.sub(s, n - 13, n - 7)), tonumber(string.sub(s, 1, n - 14))}
  end
  local a, k = {}, 1
  for i = n, 1, -7 do
    a[k], k = tonumber(string.sub(s, i > 7 and i - 6 or 1, i)), k + 1
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

local function S(a)
  local n = #a
  if n == 1 then return string.format('%d', a[1]) end
  if n == 2 then return string.format('%d%07d', a[2], a[1]) end
  if n == 3 then return string.format('%d%07d%07d', a[3], a[2], a[1]) end
  local t = {string.format('%d', a[n])}
  for i = n - 1, 1, -1 do
    t[#t + 1] = string.format('%07d', a[i])
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
        c = math.floor(s / B)
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
    c = math.floor(s / B)
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

-- fromnum returns a whole 0 <= x < 2^53 in limbs.
local function fromnum(x)
  if x < B then return {x} end
  local l1 = math.fmod(x, B)
  local y = (x - l1) / B
  if y < B then return {l1, y} end
  local l2 = math.fmod(y, B)
  return {l1, l2, (y - l2) / B}
end

-- divmod returns floor(a/d) and a mod d, for d > 0: in doubles when a is
-- below 10^14 (fmod is exact, and so is the quotient of a - r, a multiple
-- of d), else by long division with one limb of the quotient per step.
-- Each limb is guessed from doubles (off by at most one or two) and then
-- corrected exactly.
local function divmod(a, d)
  if cmp(a, d) < 0 then return Z, a end
  if #a <= 2 then
    local x, y = approx(a), approx(d)
    local r = math.fmod(x, y)
    return fromnum((x - r) / y), fromnum(r)
  end
  local q, r, dd = {}, a, approx(d)
  for k = #a - #d, 0, -1 do
    local dk = shl(d, k)
    local g = math.floor(approx(r) / (dd * B ^ k))
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

-- plimbs returns a pair (pairs.lua), h*10^9 + l below 2^64, in limbs.
local function plimbs(h, l)
  local l1 = l % B
  local c = h * 100 + (l - l1) / B
  local l2 = c % B
  return trim({l1, l2, (c - l2) / B})
end

-- lpair returns a number below 2^64 in limbs as a pair.
local function lpair(a)
  local l2, l3 = a[2] or 0, a[3] or 0
  local r = l2 % 100
  return l3 * 100000 + (l2 - r) / 100, r * B + a[1]
end

-- psplit returns a whole 0 <= x < 2^53 as a pair.
local function psplit(x)
  local l = math.fmod(x, 1000000000)
  return (x - l) / 1000000000, l
end

-- pdivtime returns, for an instant (th, tl) of at most MaxTime (2^62 ns)
-- and a span (dh, dl) > 0, as pairs: the index of the window of that
-- length that holds the instant, and how far into it the instant is. As
-- fast.lua's fwindow, it works in doubles where that is exact, for a span
-- below 2^51 of whole microseconds or dividing a second (the instant in
-- microseconds is below 2^53), else in limbs (divmod).
local function pdivtime(th, tl, dh, dl)
  if dh < 2251799 then
    local w = dh * 1000000000 + dl
    if math.fmod(w, 1000) == 0 then
      local k = w / 1000
      local lr = math.fmod(tl, 1000)
      local us = th * 1000000 + (tl - lr) / 1000
      local r = math.fmod(us, k)
      local qh, ql = psplit((us - r) / k)
      local rh, rl = psplit(r * 1000 + lr)
      return qh, ql, rh, rl
    elseif math.fmod(1000000000, w) == 0 then
      local m = 1000000000 / w
      if th * m < 2251799813685248 then
        local r = math.fmod(tl, w)
        local qh, ql = psplit(th * m + (tl - r) / w)
        return qh, ql, 0, r
      end
    end
  end
  local q, r = divmod(plimbs(th, tl), plimbs(dh, dl))
  local qh, ql = lpair(q)
  local rh, rl = lpair(r)
  return qh, ql, rh, rl
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

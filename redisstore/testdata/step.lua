-- The step in plain doubles, for the common case: every quantity it
-- touches is checked to be small enough that each sum, difference and
-- comparison below is exact (below 2^53). Times are never used whole (a
-- nanosecond Unix time is near 2^61): each is split into seconds and
-- nanoseconds, and only its distance from the key's clamped now is ever
-- computed, which a range check keeps within 2^22 s (2^22 s is about
-- 2^51.9 ns). Constants, costs, counts and spans must be below 2^51; a
-- state in debt (after a settlement) holds counts and spans up to twice a
-- constant, below 2^52, so that the sum of one of them and a constant stays
-- below 2^53. Where a check fails, fast returns nil and the exact path decides instead (pairs.lua, limbs.lua); a state
-- the exact path would refuse is never decided here, so every error comes
-- from the exact path.
--
-- The numbers are written out rather than named: the script builds its
-- functions on every call, and each named constant or library function a
-- function captures would cost an upvalue each time. They are 2^51 =
-- 2251799813685248 (the bound on constants), 2^22 = 4194304 (seconds from
-- now), -2^53 = -9007199254740992 (a time further back), 10^9 (ns in a
-- second), MaxTime = 2^62 ns = 4611686018 s + 427387904 ns, and Dekker's
-- splitter 2^27 + 1 = 134217729.

-- fdig reads a field known to hold digits only: a canonical decimal below
-- 2^51, else nil.
local function fdig(s)
  local n = #s
  if n > 16 or (n > 1 and string.byte(s, 1) == 48) then return nil end
  local v = tonumber(s)
  if v >= 2251799813685248 then return nil end
  return v
end

-- farg reads an argument: a whole number from 0 to below 2^51, else nil.
-- The arguments are the store's own canonical decimals, so tonumber reads
-- them exactly; the exact path is the strict reader of malformed ones.
local function farg(s)
  local v = tonumber(s)
  if v and v >= 0 and v < 2251799813685248 and v % 1 == 0 then return v end
  return nil
end

-- ftime splits a time field (digits only) into seconds and nanoseconds; nil
-- if it is not canonical or is beyond MaxTime.
local function ftime(s)
  local n = #s
  if n > 1 and string.byte(s, 1) == 48 then return nil end
  if n <= 9 then return 0, tonumber(s) end
  if n > 19 then return nil end
  local h, l = tonumber(string.sub(s, 1, n - 9)), tonumber(string.sub(s, n - 8))
  if h > 4611686018 or (h == 4611686018 and l > 427387904) then return nil end
  return h, l
end

-- frel returns the time field s minus the instant (H, L) in ns: exact when
-- s is at most 2^22 s away (below 2^52 either way); -2^53 when s is
-- further back; nil when it is further ahead or not a valid time.
local function frel(s, H, L)
  local h, l = ftime(s)
  if not h then return nil end
  local dh = h - H
  if dh < -4194304 then return -9007199254740992 end
  if dh > 4194304 then return nil end
  return dh * 1000000000 + (l - L)
end

-- fabs formats the instant (H, L) plus d ns, for 0 <= d < 2^52.
local function fabs(H, L, d)
  local x = L + d
  local r = math.fmod(x, 1000000000)
  local h = H + (x - r) / 1000000000
  if h > 0 then return string.format('%d%09d', h, r) end
  return string.format('%d', r)
end

-- fceilms is ceil(d / 10^6) for 0 <= d < 2^53: a span in whole ms.
local function fceilms(d)
  local r = math.fmod(d, 1000000)
  local ms = (d - r) / 1000000
  if r > 0 then ms = ms + 1 end
  return ms
end

-- ftwo returns p, e with a*b = p + e exactly (Dekker's product: p is the
-- rounded product and e its error, both doubles).
local function ftwo(a, b)
  local p = a * b
  local t = 134217729 * a
  local ah = t - (t - a)
  local al = a - ah
  t = 134217729 * b
  local bh = t - (t - b)
  local bl = b - bh
  return p, al * bl - (((p - ah * bh) - al * bh) - ah * bl)
end

-- fleq reports a*b <= c*d exactly, for whole 0 <= a, b, c, d < 2^53.
-- Rounding is monotonic, so unequal rounded products order the exact ones;
-- equal ones leave the exact difference as the difference of the errors.
local function fleq(a, b, c, d)
  local p, e = ftwo(a, b)
  local q, f = ftwo(c, d)
  if p ~= q then return p < q end
  return e <= f
end

-- fwindow returns the index of the window of length w holding the instant
-- (H, L), and how far into it the instant is, with an index below 2^51:
-- exact for windows of whole microseconds (the instant in microseconds is
-- below 2^53) and windows that divide a second; nil for others.
local function fwindow(H, L, w)
  local win, e
  if math.fmod(w, 1000) == 0 then
    local k = w / 1000
    local lr = math.fmod(L, 1000)
    local us = H * 1000000 + (L - lr) / 1000
    local r = math.fmod(us, k)
    win, e = (us - r) / k, r * 1000 + lr
  elseif math.fmod(1000000000, w) == 0 then
    local m = 1000000000 / w
    if H * m >= 2251799813685248 then return nil end
    local r = math.fmod(L, w)
    win, e = H * m + (L - r) / w, r
  else
    return nil
  end
  if win >= 2251799813685248 then return nil end
  return win, e
end

-- fast runs one check as the exact path would, or returns nil to leave it
-- to the exact path. tm is TIME's reply, or nil for a client clock; old is
-- the key's value, or false.
local function fast(key, alg, old, tm)
  local cost, margin = farg(ARGV[3]), farg(ARGV[4])
  if not cost or cost == 0 or not margin then return nil end
  -- The rule's constants first, so that a rule beyond range declines at once.
  local n, tau, tauf, cn, cf, w, cap, k
  if alg == 'm' then
    n, tau, tauf, cn, cf = farg(ARGV[5]), farg(ARGV[6]), farg(ARGV[7]), farg(ARGV[8]), farg(ARGV[9])
    if not (n and tau and tauf and cn and cf) then return nil end
  elseif alg == 'f' or alg == 'c' or alg == 'l' or alg == 's' then
    w, cap = farg(ARGV[5]), farg(ARGV[6])
    if not (w and cap) or w == 0 then return nil end
    if alg == 's' then
      k = farg(ARGV[8])
      if not k or k < 1 or k > 60 or math.fmod(w, k) ~= 0 then return nil end
    end
  else
    return nil
  end
  local H, L, reading
  if tm then
    H, L = tonumber(tm[1]), tonumber(tm[2])
    if not (H and L) or H < 1 or H >= 4611686018 then return nil end
    L = L * 1000
    reading = string.format('%d%09d', H, L)
  else
    reading = ARGV[2]
    if string.find(reading, '%D') then return nil end
    H, L = ftime(reading)
    if not H then return nil end
  end
  local now = reading -- the clamped now, as written

  -- The state's fields: f1..f4 for the fixed shapes, fs for a log.
  local fs, nf, f1, f2, f3, f4 = nil, 0, nil, nil, nil, nil
  if old and #old > 0 then
    if alg == 'l' or alg == 's' then
      if string.find(old, '[^ 0-9]') or string.find(old, '  ') or string.byte(old, 1) == 32 or string.byte(old, -1) == 32 then
        return nil
      end
      fs = {}
      for w in string.gmatch(old, '%d+') do
        nf = nf + 1
        fs[nf] = w
      end
      f1 = fs[1]
    else
      if alg == 'c' then
        f1, f2, f3, f4 = string.match(old, '^(%d+) (%d+) (%d+) (%d+)$')
        nf = 4
      else
        f1, f2, f3 = string.match(old, '^(%d+) (%d+) (%d+)$')
        nf = 3
      end
      if not f1 then
        f1, nf = string.match(old, '^%d+$'), 1
        if not f1 then return nil end
      end
    end
    -- Canonical decimals compare as numbers by length, then as strings:
    -- the latest instant needs reading only when it is later than now.
    local n1, nn = #f1, #now
    if n1 > 1 and string.byte(f1, 1) == 48 then return nil end
    if n1 > nn or (n1 == nn and f1 > now) then
      local h, l = ftime(f1)
      if not h then return nil end
      H, L, now = h, l, f1
    end
  end

  local admitted, new, ttl = 0, nil, 0
  if alg == 'm' then
    local ts, frs, dn, df = '0', '0', 0, 0
    if nf > 1 then
      ts, frs = f2, f3
      local fr, t = fdig(frs), frel(ts, H, L)
      if not (fr and t) or fr >= n then return nil end
      if t >= 0 then
        -- At most twice the capacity's span ahead (a debt): below 2^52.
        local t2, t2f = tau + tau, tauf + tauf
        if t2f >= n then t2, t2f = t2 + 1, t2f - n end
        if t > t2 or (t == t2 and fr > t2f) then return nil end
        dn, df = t, fr
      end
    end
    local nn, nr = dn + cn, df + cf
    if nr >= n then nn, nr = nn + 1, nr - n end
    if nn < tau or (nn == tau and nr <= tauf) then
      admitted, ts, frs, dn, df = 1, fabs(H, L, nn), string.format('%d', nr), nn, nr
    end
    ttl = dn
    if df ~= 0 then ttl = ttl + 1 end
    new = now .. ' ' .. ts .. ' ' .. frs
  else
    if alg == 'l' then
      if nf > 1 and nf % 2 ~= 1 then return nil end
      local rt, c = {}, {}
      local k, inside, prev = nf + 1, 0, nil
      for i = 2, nf, 2 do
        local t, ci = frel(fs[i], H, L), fdig(fs[i + 1])
        if not (t and ci) or t > 0 or ci == 0 or ci > cap + cap or (prev and prev >= t) then return nil end
        prev = t
        if t + w > 0 then
          if k > nf then k = i end
          inside = inside + ci
          if inside > cap + cap then return nil end
        end
        rt[i], c[i] = t, ci
      end
      local parts = {now}
      if inside + cost <= cap then
        admitted = 1
        local last = nf - 1
        local merge = k < nf and rt[last] == 0
        for i = k, nf, 2 do
          if merge and i == last then
            parts[#parts + 1] = fs[i] .. ' ' .. string.format('%d', c[i] + cost)
          else
            parts[#parts + 1] = fs[i] .. ' ' .. fs[i + 1]
          end
        end
        if not merge then parts[#parts + 1] = now .. ' ' .. string.format('%d', cost) end
        ttl = w
      else
        for i = 2, nf do parts[#parts + 1] = fs[i] end
        ttl = rt[nf - 1] + w
      end
      new = table.concat(parts, ' ')
    elseif alg == 's' then
      -- Buckets of g ns: the state is the latest bucket's index sc and the
      -- counts of buckets sc-k+1 to sc; a bucket before the origin holds
      -- nothing. Each sum below stays under 2^53: a count is at most
      -- 2 cap (a debt), and the window's count is capped at 2 cap + 1 as
      -- the Machine caps it, then at cap + 1 where only whether it leaves
      -- room matters.
      local g = w / k
      local win, e = fwindow(H, L, g)
      if not win then return nil end
      -- '1' counts refusals; '2' (a composite's step, which never spends
      -- a refusal) counts none but reads the states of a rule that does.
      local refused, counts = ARGV[7] ~= '0', ARGV[7] == '1'
      local sc, a = 0, {}
      for i = 1, k do a[i] = 0 end
      if nf > 1 then
        if nf ~= k + 2 then return nil end
        sc = fdig(fs[2])
        if not sc or sc > win then return nil end
        local sum = 0
        for i = 1, k do
          local ci = fdig(fs[i + 2])
          if not ci or ci > cap + cap or (ci ~= 0 and sc + i < k) then return nil end
          sum = sum + ci
          if sum > cap + cap then
            if not refused then return nil end
            sum = cap + cap + 1
          end
          a[i] = ci
        end
      end
      -- The counts seen from bucket win: shifted on by win - sc buckets.
      local d, b, sum = win - sc, {}, 0
      for i = 1, k do
        b[i] = a[i + d] or 0
        sum = sum + b[i]
        if sum > cap then sum = cap + 1 end
      end
      local put = nil
      if sum + cost <= cap then
        admitted, put = 1, b[k] + cost
      elseif counts then
        local nc = b[k] + cost
        if nc > cap then nc = cap end
        if nc > b[k] then put = nc end
      end
      local last, out = sc, a
      if put then
        b[k] = put
        last, out = win, b
      end
      local parts, any = {now, string.format('%d', last)}, false
      for i = 1, k do
        parts[i + 2] = string.format('%d', out[i])
        if out[i] ~= 0 then any = true end
      end
      -- The newest bucket that may hold anything leaves the window at
      -- bucket last + k: (last + k - win) buckets of g, at most the window.
      local m = last + k - win
      if any and m > 0 then ttl = m * g - e end
      new = table.concat(parts, ' ')
    else
      local win, e = fwindow(H, L, w)
      if not win then return nil end
      if alg == 'f' then
        local sws, scs, sw, sc = '0', '0', 0, 0
        if nf > 1 then
          sws, scs = f2, f3
          sw, sc = fdig(sws), fdig(scs)
          if not (sw and sc) or sw > win or sc > cap + cap then return nil end
        end
        local used = cost
        if sw == win then used = sc + cost end
        if used <= cap then
          admitted, sws, scs = 1, string.format('%d', win), string.format('%d', used)
        end
        ttl = w - e
        new = now .. ' ' .. sws .. ' ' .. scs
      else
        local sws, sps, scs, sw, sp, sc = '0', '0', '0', 0, 0, 0
        if nf > 1 then
          sws, sps, scs = f2, f3, f4
          sw, sp, sc = fdig(sws), fdig(sps), fdig(scs)
          if not (sw and sp and sc) or sw > win or sp > cap + cap or sc > cap + cap then return nil end
        end
        local prev, cur = 0, 0
        if win == sw then
          prev, cur = sp, sc
        elseif win == sw + 1 then
          prev = sc
        end
        -- estimate + cost <= capacity  <=>  prev*(W-e) <= (capacity-cur-cost)*W
        local used = cur + cost
        if used <= cap and fleq(prev, w - e, cap - used, w) then
          admitted, cur = 1, used
          sws, sps, scs = string.format('%d', win), string.format('%d', prev), string.format('%d', cur)
        elseif ARGV[7] == '1' then
          -- CountRefused: the refusal spends too, the count capped at the
          -- capacity; a count above it (a debt) stays as it is.
          if used > cap then
            used = cap
            if cur > cap then used = cur end
          end
          cur = used
          sws, sps, scs = string.format('%d', win), string.format('%d', prev), string.format('%d', cur)
        end
        if cur ~= 0 then
          ttl = w + w - e
        elseif prev ~= 0 then
          ttl = w - e
        end
        new = now .. ' ' .. sws .. ' ' .. sps .. ' ' .. scs
      end
    end
  end

  redis.call('SET', key, new, 'PX', fceilms(ttl) + margin)
  return {old or '', reading, new, admitted}
end


local function exact(key, alg, old, tm)
-- The exact step of the buckets (token bucket, GCRA, leaky bucket) for any
-- state, argument or time. Their step only adds, subtracts and compares
-- integers below 2^64, so each is kept as two doubles, h*10^9 + l with
-- 0 <= l < 10^9 (h below 2^35): every operation on such pairs is exact,
-- and none needs a table. pmeter(key, old, tm) is defined inside the
-- script's exact function, built only when the fast path declines. As in
-- fast.lua, numbers and library functions are written out, not captured.

-- pp reads a canonical decimal below 2^63 as a pair; nil if s is not one.
-- digits says s is known to hold digits only.
local function pp(s, digits)
  if type(s) ~= 'string' then return nil end
  local n = #s
  if n == 0 or n > 19 or (n > 1 and string.byte(s, 1) == 48) or (not digits and string.find(s, '%D'))
      or (n == 19 and s > '9223372036854775807') then
    return nil
  end
  if n <= 9 then return 0, tonumber(s) end
  return tonumber(string.sub(s, 1, n - 9)), tonumber(string.sub(s, n - 8))
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

local function pstr(h, l)
  if h > 0 then return string.format('%d%09d', h, l) end
  return string.format('%d', l)
end

local function pfail(why)
  return redis.error_reply('RATELIMIT ' .. why)
end

local function pmeter(key, old, tm)
  local fail = pfail
  local ch, cl = pp(ARGV[3])
  local mh, ml = pp(ARGV[4])
  local nh, nl = pp(ARGV[5])
  local th, tl = pp(ARGV[6])
  local fh, fl = pp(ARGV[7])
  local kh, kl = pp(ARGV[8])
  local gh, gl = pp(ARGV[9])
  if not (ch and mh and nh and th and fh and kh and gh) or (ch == 0 and cl == 0) then
    return fail('invalid argument')
  end

  -- now, clamped to MaxTime (2^62 ns), as the limbs read it.
  local wh, wl
  if tm then
    wh, wl = tonumber(tm[1]), tonumber(tm[2]) * 1000
  else
    wh, wl = pp(ARGV[2])
    if not wh then return fail('invalid argument') end
  end
  if pcmp(wh, wl, 4611686018, 427387904) > 0 then wh, wl = 4611686018, 427387904 end
  local reading = pstr(wh, wl)

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
    if pcmp(lh, ll, wh, wl) > 0 then wh, wl = lh, ll end
    if f2 then
      sh, sl = pp(f2, true)
      rh, rl = pp(f3, true)
      if not (sh and rh) or pcmp(rh, rl, nh, nl) >= 0 then return fail('invalid state') end
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
    admitted = 1
    sh, sl = padd(wh, wl, xh, xl)
    rh, rl, dh, dl, eh, el = yh, yl, xh, xl, yh, yl
  end
  if eh ~= 0 or el ~= 0 then dh, dl = padd(dh, dl, 0, 1) end
  local new = pstr(wh, wl) .. ' ' .. pstr(sh, sl) .. ' ' .. pstr(rh, rl)

  -- Keep the state until it is as good as a fresh key's, plus the margin:
  -- the debt in whole ms, rounded up.
  local r = dl % 1000000
  local ms = dh * 1000 + (dl - r) / 1000000
  if r ~= 0 then ms = ms + 1 end
  redis.call('SET', key, new, 'PX', string.format('%d', ms + tonumber(ARGV[4])))
  return {old, reading, new, admitted}
end

if alg == 'm' then return pmeter(key, old, tm) end
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

-- The step of the window rules in exact limb arithmetic (arith.lua), for
-- any state, argument or time: the end of the body of exact(key, alg, old,
-- tm), which the script defines around pairs.lua, arith.lua and this file
-- so that a check the fast path decides never builds these functions. The
-- buckets have returned by pmeter (pairs.lua) before this runs. old is the
-- key's value or false, tm TIME's reply or false.

local function fail(why)
  return redis.error_reply('RATELIMIT ' .. why)
end

-- The limb path: any state, argument or time.
local cost, margin = N(ARGV[3]), N(ARGV[4])
if not cost or iszero(cost) or not margin then return fail('invalid argument') end

local MAXT = {7387904, 8601842, 46116} -- 2^62 ns: MaxTime
local now
if tm then
  now = fromtime(tm[1], tm[2])
else
  now = N(ARGV[2])
  if not now then return fail('invalid argument') end
end
if cmp(now, MAXT) > 0 then now = MAXT end
local reading = S(now)

-- The state: space-separated canonical decimals, the latest instant first.
-- An empty value is a fresh key's, as for the Machine.
local f, fs = {}, {}
if old and #old > 0 then
  if old:find('[^ 0-9]') or old:find('  ') or old:byte(1) == 32 or old:byte(-1) == 32 then
    return fail('invalid state')
  end
  for w in old:gmatch('%d+') do
    local v = N(w, true)
    if not v then return fail('invalid state') end
    f[#f + 1], fs[#fs + 1] = v, w
  end
  if cmp(f[1], MAXT) > 0 then return fail('invalid state') end
  now = max(now, f[1])
else
  old = old or ''
end
-- A state with nothing after its instant is a fresh key's.
local fresh = #f <= 1

local admitted, new, ttl = 0, nil, nil

if alg == 's' then
  -- Buckets of g = W/k ns: the state is the latest bucket's index sc and
  -- the counts of buckets sc-k+1 to sc, oldest first; a bucket before the
  -- origin holds nothing.
  local w, cap, kk = N(ARGV[5]), N(ARGV[6]), N(ARGV[8])
  if not (w and cap and kk) or iszero(w) or iszero(kk) or #kk > 1 or kk[1] > 60 then
    return fail('invalid argument')
  end
  -- '1' counts refusals; '2' (a composite's step, which never spends a
  -- refusal) counts none but reads the states of a rule that does.
  local k, refused, counts = kk[1], ARGV[7] ~= '0', ARGV[7] == '1'
  -- A state in debt (after a settlement) holds up to twice the capacity.
  local cap2 = add(cap, cap)
  local g, gr = divmod(w, kk)
  if not iszero(gr) then return fail('invalid argument') end
  local win, e = divmod(now, g)
  local sc, a = Z, {}
  for i = 1, k do a[i] = Z end
  if not fresh then
    if #f ~= k + 2 then return fail('invalid state') end
    sc = f[2]
    if cmp(sc, win) > 0 then return fail('invalid state') end
    local sum = Z
    for i = 1, k do
      local n = f[i + 2]
      if cmp(n, cap2) > 0 or (not iszero(n) and cmp(add(sc, {i}), kk) < 0) then
        return fail('invalid state')
      end
      sum = add(sum, n)
      if not refused and cmp(sum, cap2) > 0 then return fail('invalid state') end
      a[i] = n
    end
  end
  -- The counts seen from bucket win: shifted on by win - sc buckets.
  local d = sub(win, sc)
  local b, sum = {}, Z
  for i = 1, k do
    b[i] = Z
    if cmp(d, kk) < 0 then b[i] = a[i + d[1]] or Z end
    sum = add(sum, b[i])
  end
  local put = nil
  if cmp(add(sum, cost), cap) <= 0 then
    admitted, put = 1, add(b[k], cost)
  elseif counts then
    local nc = add(b[k], cost)
    if cmp(nc, cap) > 0 then nc = cap end
    if cmp(nc, b[k]) > 0 then put = nc end
  end
  local last, out = sc, a
  if put then
    b[k] = put
    last, out = win, b
  end
  local parts, any = {S(now), S(last)}, false
  for i = 1, k do
    parts[i + 2] = S(out[i])
    if not iszero(out[i]) then any = true end
  end
  -- The newest bucket that may hold anything leaves the window at bucket
  -- last + k.
  ttl = Z
  local gone = mul(add(last, kk), g)
  if any and cmp(gone, now) > 0 then ttl = sub(gone, now) end
  new = table.concat(parts, ' ')
elseif alg == 'f' or alg == 'c' or alg == 'l' then
  local w, cap = N(ARGV[5]), N(ARGV[6])
  if not (w and cap) or iszero(w) then return fail('invalid argument') end
  -- A state in debt (after a settlement) holds up to twice the capacity.
  local cap2 = add(cap, cap)
  if alg == 'f' then
    local win = divmod(now, w)
    local sw, sc = Z, Z
    if not fresh then
      if #f ~= 3 then return fail('invalid state') end
      sw, sc = f[2], f[3]
      if cmp(sw, win) > 0 or cmp(sc, cap2) > 0 then return fail('invalid state') end
    end
    local count = Z
    if cmp(win, sw) == 0 then count = sc end
    local used = add(count, cost)
    if cmp(used, cap) <= 0 then
      admitted, sw, sc = 1, win, used
    end
    ttl = sub(mul(add(win, ONE), w), now)
    new = S(now) .. ' ' .. S(sw) .. ' ' .. S(sc)
  elseif alg == 'c' then
    local win, e = divmod(now, w)
    local sw, sp, sc = Z, Z, Z
    if not fresh then
      if #f ~= 4 then return fail('invalid state') end
      sw, sp, sc = f[2], f[3], f[4]
      if cmp(sw, win) > 0 or cmp(sp, cap2) > 0 or cmp(sc, cap2) > 0 then return fail('invalid state') end
    end
    local prev, cur = Z, Z
    local c = cmp(win, sw)
    if c == 0 then
      prev, cur = sp, sc
    elseif cmp(win, add(sw, ONE)) == 0 then
      prev = sc
    end
    -- estimate + cost <= capacity  <=>  prev*(W-e) <= (capacity-cur-cost)*W
    local used = add(cur, cost)
    if cmp(used, cap) <= 0 and cmp(mul(prev, sub(w, e)), mul(sub(cap, used), w)) <= 0 then
      admitted, cur = 1, used
      sw, sp, sc = win, prev, cur
    elseif ARGV[7] == '1' then
      -- CountRefused: the refusal spends too, the count capped at the
      -- capacity; a count above it (a debt) stays as it is.
      if cmp(used, cap) > 0 then used = max(cap, cur) end
      cur = used
      sw, sp, sc = win, prev, cur
    end
    if not iszero(cur) then
      ttl = sub(add(w, w), e)
    elseif not iszero(prev) then
      ttl = sub(w, e)
    else
      ttl = Z
    end
    new = S(now) .. ' ' .. S(sw) .. ' ' .. S(sp) .. ' ' .. S(sc)
  else
    -- Entries t cost, oldest first, at strictly increasing instants no
    -- later than now; those with t + W <= now have expired (k is the first
    -- live one).
    local m = #f
    if m > 0 and m % 2 ~= 1 then return fail('invalid state') end
    local k, inside = m + 1, Z
    for i = 2, m, 2 do
      local t, c = f[i], f[i + 1]
      if cmp(t, now) > 0 or (i > 2 and cmp(f[i - 2], t) >= 0) or iszero(c) or cmp(c, cap2) > 0 then
        return fail('invalid state')
      end
      if cmp(add(t, w), now) > 0 then
        if k > m then k = i end
        inside = add(inside, c)
      end
    end
    if cmp(inside, cap2) > 0 then return fail('invalid state') end
    local parts = {S(now)}
    if cmp(add(inside, cost), cap) <= 0 then
      admitted = 1
      local last = m - 1
      local merge = k < m and cmp(f[last], now) == 0
      for i = k, m, 2 do
        if merge and i == last then
          parts[#parts + 1] = fs[i] .. ' ' .. S(add(f[i + 1], cost))
        else
          parts[#parts + 1] = fs[i] .. ' ' .. fs[i + 1]
        end
      end
      if not merge then parts[#parts + 1] = S(now) .. ' ' .. S(cost) end
      ttl = w
    else
      for i = 2, m do parts[#parts + 1] = fs[i] end
      ttl = sub(add(f[m - 1], w), now)
    end
    new = table.concat(parts, ' ')
  end
else
  return fail('invalid argument')
end

-- Keep the state until it is as good as a fresh key's, plus the margin.
redis.call('SET', key, new, 'PX', string.format('%d', ceilms(ttl) + tonumber(ARGV[4])))
return {old, reading, new, admitted}

end
-- One check of one key, atomically: read the key's state, clamp now to the
-- state's latest instant, admit or deny exactly as the in-process limiter
-- does, write the new state with its expiry, and return what Go needs to
-- recompute and verify the Decision.
--
-- KEYS[1]  the key's state
-- ARGV[1]  the algorithm's step: 'm' the buckets (token
--          bucket, GCRA, leaky bucket), 'f' fixed window,
--          'c' sliding counter, 'l' sliding log, 's'
--          sub-window counter (the codes and positions are the table's,
--          algorithms.go, written in when the script is assembled)
-- ARGV[2]  now in ns since the Unix epoch, or '' for the server's TIME
-- ARGV[3]  cost in milli-units
-- ARGV[4]  expiry margin in ms, added to the time until the state
--          is as good as a fresh key's
-- meter:   ARGV[5] n (the pace's milli-units), ARGV[6] and
--          ARGV[7] the capacity's span (ns, frac/n),
--          ARGV[8] and ARGV[9] the cost's span
--          (ns, frac/n)
-- windows: ARGV[5] window (ns), ARGV[6] capacity
--          (milli-units); for the sliding counter and the sub-window
--          counter, ARGV[7] '1' counts a refused cost too
--          (CountRefused), each window's or bucket's count capped at the
--          capacity, '0' not; for the sub-window counter, ARGV[8]
--          the number of buckets, from 1 to 60, which divides the window.
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

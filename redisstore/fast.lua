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

-- farg reads an argument: a whole number from 0 to below 2^51, else nil or
-- false. The arguments are the store's own canonical decimals, so tonumber
-- reads them exactly; the exact path is the strict reader of malformed ones.
-- It reads the seconds of a time too (TIME's, or a state field's digits up
-- to its last nine), which are below 2^51 in every time the fast path takes.
--
-- A library (functions.go) sets argCache to a table once, when it loads,
-- and farg then keeps what it read for each text: a rule's arguments are
-- the same on every check, and the seconds of the times a key sees change
-- once a second, and a lookup costs less than tonumber and the range
-- checks. What it keeps depends on the text alone, so a kept value is the
-- one farg would compute again; it holds at most 256 texts, then starts
-- afresh. A script (EVALSHA, or a composite's layerstep) keeps nothing:
-- its locals last one call. fast looks a text up in argCache itself before
-- it calls farg, where a call would cost more than the lookup.
local argCache, argCached = false, 0

-- pxCache is the library's too (false in a script): it keeps the text of
-- each expiry fast has written, by its number, at most 256 of them, then
-- starts afresh. A number passed to redis.call is written out with
-- "%.17g", a costly conversion of a double; a text passes as it is, and a
-- rule's expiries take few values (a bucket's without debt, one), so most
-- checks find theirs kept. A bucket's expiry in debt grows with the debt,
-- so that it is rarely written twice: the library writes its text without
-- looking for it or keeping it, which would cost more than it saves and
-- push out the expiries that are written again. A whole number below 2^53
-- reads the same either way, and each expiry is one (a span in whole
-- ms, plus a margin below 2^51).
local pxCache, pxCached = false, 0

-- secCache is the library's too (false in a script): for the seconds of
-- the TIME it read last, their text, the texts of the next second and of
-- the first instants of the next two seconds ({Ht, text of H+1, H+1 then
-- nine '0's, H+2 then nine '0's}), set only when the three seconds' texts
-- have one length and H+2 is before MaxTime's second. A time as long as
-- TIME's instant, and from that instant on, is then in TIME's second when
-- its text is below the first, in the next when below the second: its
-- distance from TIME comes from its last nine digits alone, without
-- reading its seconds; and an instant written in the next second needs
-- only its nine digits formatted. The first instants' texts are kept,
-- though the seconds' texts give them, so that a check makes no string
-- to compare against.
local secCache = false
local function farg(s)
  if argCache then
    local v = argCache[s]
    if v ~= nil then return v end
  end
  local v = tonumber(s)
  if not (v and v >= 0 and v < 2251799813685248 and v % 1 == 0) then v = false end
  if argCache and s then
    if argCached >= 256 then argCache, argCached = {}, 0 end
    argCache[s], argCached = v, argCached + 1
  end
  return v
end

-- fnano reads the last nine digits of s, of length n (at least nine, digits
-- only): a time's nanoseconds. They are summed from their bytes: tonumber
-- would cut them out as a string of their own and read it with the C
-- library's strtod, which costs several times more (48 * 111111111 =
-- 5333333328 takes off the nine digits' '0's).
local function fnano(s, n)
  local a, b, c, d, e, f, g, i, j = string.byte(s, n - 8, n)
  return a * 100000000 + b * 10000000 + c * 1000000 + d * 100000 + e * 10000 + f * 1000 + g * 100 + i * 10 + j - 5333333328
end

-- ftime splits a time field (digits only) into seconds and nanoseconds; nil
-- if it is not canonical or is beyond MaxTime.
local function ftime(s)
  local n = #s
  if n > 1 and string.byte(s, 1) == 48 then return nil end
  if n <= 9 then return 0, tonumber(s) end
  if n > 19 then return nil end
  local sec = string.sub(s, 1, n - 9)
  local h, l = argCache and argCache[sec] or farg(sec), fnano(s, n)
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

-- fabs returns pre, a space, the instant (H, L) plus d ns, a space and
-- post, for 0 <= d < 2^52, in one concatenation: Lua interns each string
-- it makes (a hash, a lookup, an allocation, then collection), so the
-- pieces are not joined one at a time. Ht and Ht1, if not nil, are the
-- canonical decimals of H and H + 1 (TIME's seconds and the next, see
-- secCache), kept for an instant in either second, whose nine digits
-- alone are then formatted: each number string.format converts costs as
-- much as the rest of the formatting.
local function fabs(H, L, d, Ht, Ht1, pre, post)
  local x = L + d
  local r = math.fmod(x, 1000000000)
  local h = H + (x - r) / 1000000000
  local st = h == H and Ht or h == H + 1 and Ht1
  if st then return pre .. ' ' .. st .. string.format('%09d', r) .. ' ' .. post end
  if h > 0 then return pre .. ' ' .. string.format('%d%09d', h, r) .. ' ' .. post end
  return pre .. ' ' .. string.format('%d', r) .. ' ' .. post
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

-- fast runs one check as the exact path would and returns the step's four
-- fields (see step.lua) as four values, as the exact path does, not a table,
-- which would be one more object for the script to make and collect; or
-- it returns nil to leave the check to the exact path. tm is TIME's reply,
-- or nil for a client clock; old is the key's value, or false.
local function fast(key, alg, old, tm)
  -- A value kept is a number; nil (not kept) or false (kept, but out of
  -- range) goes to farg. A check the library took packed (packed.lua)
  -- finds what farg reads of each argument kept by position, in ARGV.v.
  local kc, kv = argCache, ARGV.v
  local cost, margin
  if kv then
    cost, margin = kv[ARG_COST], kv[ARG_MARGIN]
  else
    cost, margin = kc and kc[ARGV[ARG_COST]] or farg(ARGV[ARG_COST]), kc and kc[ARGV[ARG_MARGIN]] or farg(ARGV[ARG_MARGIN])
  end
  if not cost or cost == 0 or not margin then return nil end
  -- The rule's constants first, so that a rule beyond range declines at once.
  local n, tau, tauf, cn, cf, w, cap, k
  local qn, qf = false, false
  if alg == ALG_METER then
    if kv then
      n, tau, tauf, cn, cf = kv[ARG_PACE], kv[ARG_TAU], kv[ARG_TAU_FRAC], kv[ARG_COST_SPAN], kv[ARG_COST_FRAC]
    else
      n, tau, tauf = kc and kc[ARGV[ARG_PACE]] or farg(ARGV[ARG_PACE]), kc and kc[ARGV[ARG_TAU]] or farg(ARGV[ARG_TAU]), kc and kc[ARGV[ARG_TAU_FRAC]] or farg(ARGV[ARG_TAU_FRAC])
      cn, cf = kc and kc[ARGV[ARG_COST_SPAN]] or farg(ARGV[ARG_COST_SPAN]), kc and kc[ARGV[ARG_COST_FRAC]] or farg(ARGV[ARG_COST_FRAC])
    end
    if not (n and tau and tauf and cn and cf) then return nil end
    -- A check bounded on its Delay: the least queue ahead that is too long.
    -- It is only compared with a debt below 2^52, so any number reads
    -- exactly enough (one beyond 2^53 rounds, but stays beyond every
    -- debt); it changes from check to check, so farg does not keep it.
    if ARGV[ARG_MAX_DELAY] then
      qn, qf = tonumber(ARGV[ARG_MAX_DELAY]), tonumber(ARGV[ARG_MAX_DELAY_FRAC])
      if not (qn and qf) then return nil end
    end
  elseif alg == ALG_FIXED or alg == ALG_COUNTER or alg == ALG_LOG or alg == ALG_SUB then
    w, cap = kv and kv[ARG_WINDOW] or farg(ARGV[ARG_WINDOW]), kv and kv[ARG_CAPACITY] or farg(ARGV[ARG_CAPACITY])
    if not (w and cap) or w == 0 then return nil end
    if alg == ALG_SUB then
      k = kv and kv[ARG_BUCKETS] or farg(ARGV[ARG_BUCKETS])
      if not k or k < 1 or k > 60 or math.fmod(w, k) ~= 0 then return nil end
    end
  else
    return nil
  end
  local H, L, reading, Ht
  if tm then
    local us = tm[2]
    Ht = tm[1]
    H = kc and kc[Ht] or farg(Ht)
    if not H or H < 1 or H >= 4611686018 then return nil end
    -- TIME's seconds are a canonical decimal, as %d would write H, and its
    -- microseconds one below 10^6: padded to six digits, then three zeros,
    -- which are the reading's last nine digits (see fnano).
    if #us == 6 then
      reading = Ht .. us .. '000'
      L = fnano(reading, #reading)
    else
      L = tonumber(us)
      if not L then return nil end
      L = L * 1000
      reading = Ht .. string.format('%09d', L)
    end
  else
    reading = ARGV[ARG_NOW]
    if string.find(reading, '%D') then return nil end
    H, L = ftime(reading)
    if not H then return nil end
  end
  local now = reading -- the clamped now, as written

  -- The state's fields: f1..f4 for the fixed shapes, fs for a log.
  local fs, nf, f1, f2, f3, f4 = nil, 0, nil, nil, nil, nil
  local canon = false -- f1 and f2 are known canonical
  if old and #old > 0 then
    if alg == ALG_LOG or alg == ALG_SUB then
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
      if alg == ALG_COUNTER then
        f1, f2, f3, f4 = string.match(old, '^(%d+) (%d+) (%d+) (%d+)$')
        nf = 4
      elseif alg == ALG_METER then
        -- A bucket's two instants are matched canonical and nonzero, so
        -- that neither needs a look at its first digit; a state with an
        -- instant of 0 goes to the exact path.
        f1, f2, f3 = string.match(old, '^([1-9]%d*) ([1-9]%d*) (%d+)$')
        nf, canon = 3, true
      else
        f1, f2, f3 = string.match(old, '^(%d+) (%d+) (%d+)$')
        nf = 3
      end
      if not f1 then
        f1, nf, canon = string.match(old, '^%d+$'), 1, false
        if not f1 then return nil end
      end
    end
    -- Canonical decimals compare as numbers by length, then as strings:
    -- the latest instant needs reading only when it is later than now.
    local n1, nn = #f1, #now
    if not canon and n1 > 1 and string.byte(f1, 1) == 48 then return nil end
    if n1 > nn or (n1 == nn and f1 > now) then
      local h, l = ftime(f1)
      if not h then return nil end
      H, L, now, Ht = h, l, f1, nil
    end
  end

  local admitted, new, ttl, debt = 0, nil, 0, false
  if alg == ALG_METER then
    local ts, frs, dn, df, Ht1 = '0', '0', 0, 0, nil
    if nf > 1 then
      ts, frs = f2, f3
      -- A whole span's fraction is '0': no need to read it. Nor a time
      -- before now (t < 0, no debt), which canonical decimals show by
      -- length, then as strings, as for the latest instant above: a
      -- canonical time below now is a valid one, and the state's pattern
      -- above matched it canonical.
      local fr, t, nt, nn = 0, -1, #ts, #now
      if nt > nn or (nt == nn and ts >= now) then
        -- A debt: TIME's next seconds, kept (see secCache), while now is
        -- TIME's instant.
        local sc = secCache
        if Ht and sc and nt == nn then
          if sc[1] ~= Ht then
            sc[1], sc[2] = Ht, false
            if H < 4611686016 then
              local t1, t2 = string.format('%d', H + 1), string.format('%d', H + 2)
              if #t2 == #Ht then sc[2], sc[3], sc[4] = t1, t1 .. '000000000', t2 .. '000000000' end
            end
          end
          Ht1 = sc[2]
        end
        if Ht1 and ts < sc[4] then
          t = fnano(ts, nt) - L
          if ts >= sc[3] then t = t + 1000000000 end
        else
          t = frel(ts, H, L)
        end
      end
      if frs ~= '0' then fr = fdig(frs) end
      if not (fr and t) or fr >= n then return nil end
      if t >= 0 then
        -- At most twice the capacity's span ahead (a debt): below 2^52.
        local t2, t2f = tau + tau, tauf + tauf
        if t2f >= n then t2, t2f = t2 + 1, t2f - n end
        if t > t2 or (t == t2 and fr > t2f) then return nil end
        dn, df, debt = t, fr, true
      end
    end
    local nn, nr = dn + cn, df + cf
    if nr >= n then nn, nr = nn + 1, nr - n end
    if nn < tau or (nn == tau and nr <= tauf) then
      if qn and (dn > qn or (dn == qn and df >= qf)) then
        admitted = 2
      else
        admitted, dn, df = 1, nn, nr
      end
    end
    -- A bounded check writes only what it admits.
    if qn and admitted ~= 1 then return old or '', reading, '', admitted end
    ttl = dn
    if df ~= 0 then ttl = ttl + 1 end
    if admitted == 1 then
      new = fabs(H, L, nn, Ht, Ht1, now, nr == 0 and '0' or string.format('%d', nr))
    else
      new = now .. ' ' .. ts .. ' ' .. frs
    end
  else
    if alg == ALG_LOG then
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
    elseif alg == ALG_SUB then
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
      local refused, counts = ARGV[ARG_REFUSED] ~= '0', ARGV[ARG_REFUSED] == '1'
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
      if alg == ALG_FIXED then
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
        elseif ARGV[ARG_REFUSED] == '1' then
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

  -- The expiry: ttl (0 <= ttl < 2^53 ns) in whole ms, rounded up, plus
  -- the margin.
  local r = math.fmod(ttl, 1000000)
  local px = (ttl - r) / 1000000 + margin
  if r > 0 then px = px + 1 end
  if pxCache then
    if debt then
      px = string.format('%d', px)
    else
      local t = pxCache[px]
      if not t then
        t = string.format('%d', px)
        if pxCached >= 256 then pxCache, pxCached = {}, 0 end
        pxCache[px], pxCached = t, pxCached + 1
      end
      px = t
    end
  end
  redis.call('SET', key, new, 'PX', px)
  return old or '', reading, new, admitted
end

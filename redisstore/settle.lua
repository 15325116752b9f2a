-- Refund and Settle of any rule on one key, or on several keys at once (a
-- composite's layers, which share a slot), each of a bucket rule (token
-- bucket, GCRA, leaky bucket), a fixed window, a sliding log, a sliding
-- counter or a sub-window, computed here and written in the same script,
-- so that checks running at the same time never make it retry: the
-- arithmetic of each rule's Machine (Refund, Settle) in exact limbs
-- (arith.lua, which the script defines before this file). Every key is
-- read first, and settled at one instant: now raised to the latest
-- instant any key holds. The Go side runs each key's Machine on the state
-- this script read, at that instant, and checks that it gives back,
-- charges and writes exactly what this script did.
--
-- KEYS     the keys' states, "last ..." (see the Machine's encoding)
-- ARGV[SARG_NOW]   now in ns since the Unix epoch, or '' for the server's TIME
-- ARGV[SARG_MODE]   'r' refund, 's' settle
-- ARGV[SARG_COST]   refund: the cost to give back (each key gives back at
--           most its capacity); settle: the cost charged, from 1 to each
--           key's capacity (milli-units)
-- ARGV[SARG_ACTUAL]   settle: the actual cost, above 0 (milli-units)
-- ARGV[SARG_AT]   at: the admitting Decision's At, at least 0 (ns)
-- ARGV[SARG_MARGIN]   expiry margin in ms
-- Then a block of arguments per key, in the keys' order; key i's
-- ARGV[SARG_x + PER * (i - 1)], PER the block's length:
-- ARGV[SARG_PACE], ARGV[SARG_PERIOD] the pace, n milli-units per p ns;
--           ARGV[SARG_TAU], ARGV[SARG_TAU_FRAC] the capacity's span tau
--           (ns, frac/n); ARGV[SARG_CAPACITY] the capacity (milli-units).
--           For a window rule, ARGV[SARG_WINDOW] (in the pace's place) is
--           the window (ns), ARGV[SARG_REFUSED] (in the period's) '1' if
--           it has CountRefused, and the capacity's span is unused
-- ARGV[SARG_BUCKETS]  a sub-window's buckets, from 1 to 60
-- ARGV[SARG_COST_SPAN], ARGV[SARG_COST_FRAC] settle: the span of the cost
--           charged (ns, frac/n)
-- ARGV[SARG_ALG]  the rule's step (algorithms.go): ALG_METER a bucket
--           rule, ALG_FIXED a fixed window, ALG_LOG a sliding log,
--           ALG_COUNTER a sliding counter, ALG_SUB a sub-window
-- ARGV[SARG_KEEP]  '1' for a key that is only read (a shadow layer's):
--           its latest instant counts, its state must be one its rule
--           could have written, and it is left as it is, giving back 0
--
-- Returns {now used before clamping, then for each key: its old state or
-- '', the state written or '', given back (refund) or the cost as settled
-- (settle), the expiry set in ms or ''}. A state that is not well formed,
-- more than twice the capacity's span in debt, or (a window) counting more
-- than twice the capacity (in a count, an entry, or a window but with
-- CountRefused) or a window, bucket or entry later than now (but for a
-- fixed window's count in the window after now's, which a Plans' move
-- writes), is an error
-- reply and nothing is written to any key: the states the Machine
-- refuses. A key Redis does not hold gives nothing back and is not
-- created, but for a settlement that charges.

local function fail(why)
  return redis.error_reply('RATELIMIT ' .. why)
end

-- Each key's arguments are a block of PER, from SARG_PACE on.
local PER = SARG_KEEP - SARG_PACE + 1
local mode = ARGV[SARG_MODE]
local c0, act, at, margin = N(ARGV[SARG_COST]), N(ARGV[SARG_ACTUAL]), N(ARGV[SARG_AT]), N(ARGV[SARG_MARGIN])
if not (c0 and at and margin) or iszero(c0) or (mode == 's' and not (act and not iszero(act)))
    or (mode ~= 's' and mode ~= 'r') or #ARGV ~= SARG_PACE - 1 + PER * #KEYS then
  return fail('invalid argument')
end

local MAXT = {7387904, 8601842, 46116} -- 2^62 ns: MaxTime
local MAXTAT = N('9223372036854775807')
local now
if ARGV[SARG_NOW] == '' then
  local tm = redis.call('TIME')
  now = fromtime(tm[1], tm[2])
else
  now = N(ARGV[SARG_NOW])
  if not now then return fail('invalid argument') end
end
if cmp(now, MAXT) > 0 then now = MAXT end
local reading = S(now)

-- parse reads a state as space-separated canonical decimals, the latest
-- instant first, no later than MaxTime: their values and their strings;
-- nil for anything else, and two empty lists for no state.
local function parse(old)
  local f, fs = {}, {}
  if old == '' then return f, fs end
  if old:find('[^ 0-9]') or old:find('  ') or old:byte(1) == 32 or old:byte(-1) == 32 then return nil end
  for w in old:gmatch('%d+') do
    local v = N(w, true)
    if not v then return nil end
    f[#f + 1], fs[#fs + 1] = v, w
  end
  if cmp(f[1], MAXT) > 0 then return nil end
  return f, fs
end

-- Every key's state, read first, and one instant for all of them: now
-- raised to the latest instant any of them holds.
local olds, parsed = {}, {}
for i = 1, #KEYS do
  local v = redis.pcall('GET', KEYS[i])
  if type(v) == 'table' then return fail('invalid state: ' .. tostring(v.err)) end
  olds[i] = v or ''
  local f, fs = parse(olds[i])
  if f then
    parsed[i] = {f, fs}
    if f[1] and cmp(f[1], now) > 0 then now = f[1] end
  end
end

-- settle runs the mode on key i at now, writing nothing: it returns the
-- key's reply, {state read, state to write or '', given back or the cost
-- as settled, the expiry to set in ms or ''}, or an error reply.
local function settle(i, now)
  local old = olds[i]
  local function arg(s) return ARGV[s + PER * (i - 1)] end
  local alg = arg(SARG_ALG)
  local c = c0
  local n, p, tau, tauf, cap = N(arg(SARG_PACE)), N(arg(SARG_PERIOD)), N(arg(SARG_TAU)), N(arg(SARG_TAU_FRAC)), N(arg(SARG_CAPACITY))
  local window = alg == ALG_FIXED or alg == ALG_COUNTER or alg == ALG_LOG or alg == ALG_SUB
  local counts = (alg == ALG_COUNTER or alg == ALG_SUB) and arg(SARG_REFUSED) == '1'
  if window then p, tau, tauf = ONE, Z, Z end
  if not (n and p and tau and tauf and cap) or iszero(n) or iszero(p) or (alg ~= ALG_METER and not window) then
    return fail('invalid argument')
  end
  -- A refund gives back at most the key's capacity.
  if mode == 'r' and cmp(c, cap) > 0 then c = cap end

  -- A fresh key: nothing to give back.
  local charging = mode == 's' and cmp(act, c) > 0
  if old == '' and not charging then
    local x = '0'
    if mode == 's' then x = S(c) end
    return {'', '', x, ''}
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

  -- finish returns the reply for the state new, written with the expiry
  -- px ms, or keeping the key's if px is '', unless it is the state read,
  -- and the amount x.
  local function finish(new, x, px)
    if new == old then return {old, '', S(x), ''} end
    return {old, new, S(x), px}
  end

  -- fields reads the state read as parse does (nil for a state that is
  -- not well formed). The state() above cannot read a sub-window's, which
  -- holds more numbers than a Lua pattern can capture.
  local function fields()
    local pf = parsed[i]
    if not pf then return nil end
    return pf[1], pf[2]
  end

  -- expiry is the expiry in ms for a Decision's ResetAfter reset (ns).
  local function expiry(reset)
    local ms = add(N(string.format('%d', ceilms(reset))), margin)
    if cmp(ms, MAXTAT) > 0 then ms = MAXTAT end
    return S(ms)
  end

  -- atnow is at, no later than now.
  local function atnow()
    if cmp(at, now) > 0 then return now end
    return at
  end

  -- room is up to extra of what twice the capacity leaves beside used.
  local function room(extra, used)
    local c2 = add(cap, cap)
    if cmp(used, c2) >= 0 then return Z end
    local g = sub(c2, used)
    if cmp(extra, g) < 0 then g = extra end
    return g
  end

  -- settled runs the mode on a window rule, with its refund(cost), which
  -- gives back up to cost of what was admitted at at, and its
  -- charge(extra), which spends up to extra at now and returns what it
  -- spent and the Decision's ResetAfter after it (a peek of the cost
  -- charged). It returns what was given back or the cost as settled, and
  -- the expiry to set ('' keeps the key's).
  local function settled(refund, charge)
    if mode == 'r' then return refund(c), '' end
    if charging then
      local g, reset = charge(sub(act, c))
      return add(c, g), expiry(reset)
    end
    if cmp(act, c) == 0 then return c, '' end
    return sub(c, refund(sub(c, act))), ''
  end

  -- A fixed window: "last win count", n the window.
  if alg == ALG_FIXED then
    local f = state(2)
    if not f or cmp(f[2], add(cap, cap)) > 0 then return fail('invalid state') end
    local sw, sc = f[1], f[2]
    local win, e = divmod(now, n)
    local left = sub(n, e)
    if cmp(sw, add(win, ONE)) == 0 then
      -- A count in the window after now's (a key a Plans moved in) holds
      -- from now on, until that window ends, as the Machine's does.
      win, left = sw, add(left, n)
    elseif cmp(sw, win) > 0 then
      return fail('invalid state')
    end
    local count = Z
    if cmp(sw, win) == 0 then count = sc end
    -- frefund gives back up to cost of what was admitted at at, in this window.
    local function frefund(cost)
      if iszero(count) or cmp(divmod(atnow(), n), win) ~= 0 then return Z end
      local g = cost
      if cmp(count, g) < 0 then g = count end
      sw, sc = win, sub(count, g)
      return g
    end
    local x, px = settled(frefund, function(extra)
      local g = room(extra, count)
      if not iszero(g) then sw, sc = win, add(count, g) end
      -- The Decision's ResetAfter is the time left in the window.
      return g, left
    end)
    local new = S(now) .. ' ' .. S(sw) .. ' ' .. S(sc)
    return finish(new, x, px)
  end

  -- A sliding counter: "last win prev cur", n the window.
  if alg == ALG_COUNTER then
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
      local aw = divmod(atnow(), n)
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
    local x, px = settled(crefund, function(extra)
      -- In use: the estimate at now, rounded up.
      local q, r = divmod(mul(prev, left), n)
      if not iszero(r) then q = add(q, ONE) end
      local g = room(extra, add(q, cur))
      if not iszero(g) then
        cur = add(cur, g)
        sw, sp, sc = win, prev, cur
      end
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
      return g, reset
    end)
    local new = S(now) .. ' ' .. S(sw) .. ' ' .. S(sp) .. ' ' .. S(sc)
    return finish(new, x, px)
  end

  -- A sliding log: "last t c t c ...", entries oldest first at strictly
  -- increasing instants no later than now; n the window. An entry with
  -- t + n <= now has expired.
  if alg == ALG_LOG then
    local f, fs = fields()
    if not f or (#f > 0 and #f % 2 == 0) then return fail('invalid state') end
    local c2 = add(cap, cap)
    -- An entry is live iff t > lo = now - n (every entry if now < n). k is
    -- the first live entry's index (m + 1 for none), inside the cost the
    -- live entries hold.
    local lo = nil
    if cmp(now, n) >= 0 then lo = sub(now, n) end
    local m, k, inside = #f, #f + 1, Z
    for i = 2, m, 2 do
      local t, tc = f[i], f[i + 1]
      if cmp(t, now) > 0 or (i > 2 and cmp(f[i - 2], t) >= 0) or iszero(tc) or cmp(tc, c2) > 0 then
        return fail('invalid state')
      end
      -- The entries after a live one are live.
      if k <= m or not lo or cmp(t, lo) > 0 then
        if k > m then k = i end
        inside = add(inside, tc)
        if cmp(inside, c2) > 0 then return fail('invalid state') end
      end
    end
    -- The entries written, as "t c" strings; nil: those read, as they were.
    local parts = nil
    -- lrefund gives back up to cost of the entry at at, if it is live; the
    -- state then keeps the live entries only, and that one only if
    -- something is left of it.
    local function lrefund(cost)
      local a = atnow()
      if lo and cmp(a, lo) <= 0 then return Z end
      for i = k, m, 2 do
        local o = cmp(f[i], a)
        if o > 0 then break end
        if o == 0 then
          local g = cost
          if cmp(f[i + 1], g) < 0 then g = f[i + 1] end
          parts = {}
          for j = k, m, 2 do
            if j ~= i then
              parts[#parts + 1] = fs[j] .. ' ' .. fs[j + 1]
            elseif cmp(f[j + 1], g) > 0 then
              parts[#parts + 1] = fs[j] .. ' ' .. S(sub(f[j + 1], g))
            end
          end
          return g
        end
      end
      return Z
    end
    local x, px = settled(lrefund, function(extra)
      -- An entry of what twice the capacity leaves room for at now, merged
      -- into the newest if that is at now; the state then keeps the live
      -- entries only.
      local g = room(extra, inside)
      if not iszero(g) then
        parts = {}
        local merge = k < m and cmp(f[m - 1], now) == 0
        for j = k, m, 2 do
          if merge and j == m - 1 then
            parts[#parts + 1] = fs[j] .. ' ' .. S(add(f[j + 1], g))
          else
            parts[#parts + 1] = fs[j] .. ' ' .. fs[j + 1]
          end
        end
        if not merge then parts[#parts + 1] = S(now) .. ' ' .. S(g) end
      end
      -- The Decision's ResetAfter, a peek of the cost charged: a window
      -- from now if it is admitted or the charge made an entry at now,
      -- else until the newest entry leaves the window.
      if iszero(g) and cmp(add(inside, c), cap) > 0 then return g, sub(add(f[m - 1], n), now) end
      return g, n
    end)
    local out = {S(now)}
    if parts then
      for i = 1, #parts do out[i + 1] = parts[i] end
    else
      for i = 2, m do out[i] = fs[i] end
    end
    return finish(table.concat(out, ' '), x, px)
  end

  -- A sub-window: "last sc n...", the latest bucket's index sc and the
  -- counts of buckets sc-k+1 to sc, oldest first, in buckets of g = n/k ns;
  -- a bucket before the origin holds nothing.
  if alg == ALG_SUB then
    local kk = N(arg(SARG_BUCKETS))
    if not kk or iszero(kk) or #kk > 1 or kk[1] > 60 then return fail('invalid argument') end
    local k = kk[1]
    local g, gr = divmod(n, kk)
    if not iszero(gr) then return fail('invalid argument') end
    local f = fields()
    if not f or (#f > 1 and #f ~= k + 2) then return fail('invalid state') end
    local c2 = add(cap, cap)
    local win = divmod(now, g)
    local sc, a, sum = Z, {}, Z
    for i = 1, k do a[i] = Z end
    if #f > 1 then
      sc = f[2]
      if cmp(sc, win) > 0 then return fail('invalid state') end
      for i = 1, k do
        local v = f[i + 2]
        if cmp(v, c2) > 0 or (not iszero(v) and cmp(add(sc, {i}), kk) < 0) then return fail('invalid state') end
        sum = add(sum, v)
        if not counts and cmp(sum, c2) > 0 then return fail('invalid state') end
        a[i] = v
      end
    end
    -- d buckets from sc to win: bucket sc-k+i is in the window iff i > d.
    local d = sub(win, sc)
    -- srefund gives back up to cost of what bucket at/g holds, if it is in
    -- the window.
    local function srefund(cost)
      local j = divmod(atnow(), g)
      local jk = add(j, kk)
      if cmp(j, sc) > 0 or cmp(jk, sc) <= 0 or cmp(jk, win) <= 0 then return Z end
      local i = sub(jk, sc)[1]
      local v = a[i]
      if iszero(v) then return Z end
      local x = cost
      if cmp(v, x) < 0 then x = v end
      a[i] = sub(v, x)
      return x
    end
    local x, px = settled(srefund, function(extra)
      -- Into bucket win, while the window holds less than twice the
      -- capacity; the state moves on to bucket win.
      local total = Z
      for i = 1, k do
        if cmp({i}, d) > 0 then total = add(total, a[i]) end
      end
      local ex = room(extra, total)
      if not iszero(ex) then
        local b = {}
        for i = 1, k do
          b[i] = Z
          if cmp(d, kk) < 0 then b[i] = a[i + d[1]] or Z end
        end
        b[k] = add(b[k], ex)
        a, sc, d = b, win, Z
      end
      -- The Decision's ResetAfter, a peek's of the cost charged: until
      -- bucket win leaves the window if the peek admits the cost or counts
      -- it refused (into bucket win, below the capacity), else until the
      -- newest bucket in the window that holds anything leaves it, 0 for
      -- none.
      local cur = Z
      if iszero(d) then cur = a[k] end
      if cmp(add(add(total, ex), c), cap) <= 0 or (counts and cmp(cur, cap) < 0) then
        return ex, sub(mul(add(win, kk), g), now)
      end
      for i = k, 1, -1 do
        if cmp({i}, d) <= 0 then break end
        if not iszero(a[i]) then return ex, sub(mul(add(sc, {i}), g), now) end
      end
      return ex, Z
    end)
    local out = {S(now), S(sc)}
    for i = 1, k do out[i + 2] = S(a[i]) end
    return finish(table.concat(out, ' '), x, px)
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
    local g, a = cost, atnow()
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
    local g = room(extra, spent)
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
    local cn, cf = N(arg(SARG_COST_SPAN)), N(arg(SARG_COST_FRAC))
    if not (cn and cf) then return fail('invalid argument') end
    local nn, nf = add(dn2, cn), add(df2, cf)
    if cmp(nf, n) >= 0 then nn, nf = add(nn, ONE), sub(nf, n) end
    local k = cmp(nn, tau)
    if k < 0 or (k == 0 and cmp(nf, tauf) <= 0) then dn2, df2 = nn, nf end
    if not iszero(df2) then dn2 = add(dn2, ONE) end
    px = expiry(dn2)
  elseif cmp(act, c) == 0 then
    x = c
  else
    x = sub(c, refund(sub(c, act)))
  end

  local new = S(now) .. ' ' .. S(ts) .. ' ' .. S(fr)
  return finish(new, x, px)
end

local out, writes = {reading}, {}
for i = 1, #KEYS do
  local r = settle(i, now)
  if r.err then return r end
  -- A key kept as it is was settled only to check its state.
  if ARGV[SARG_KEEP + PER * (i - 1)] == '1' then r = {r[1], '', '0', ''} end
  writes[i] = r
end
-- Every key computed: write them together.
for i = 1, #KEYS do
  local r = writes[i]
  if r[2] ~= '' then
    if r[4] ~= '' then
      redis.call('SET', KEYS[i], r[2], 'PX', r[4])
    else
      redis.call('SET', KEYS[i], r[2], 'KEEPTTL')
    end
  end
  for k = 1, 4 do out[#out + 1] = r[k] end
end
return out

-- The step of the window rules in exact limb arithmetic (arith.lua), for
-- any state, argument or time: the end of the body of exact(key, alg, old,
-- tm), which the script defines around pairs.lua, arith.lua and this file
-- so that a check the fast path decides never builds these functions (a
-- library defines pairs.lua's and arith.lua's once, when it loads). The
-- buckets have returned by pmeter (pairs.lua) before this runs. old is the
-- key's value or false, tm TIME's reply or false.

local function fail(why)
  return redis.error_reply('RATELIMIT ' .. why)
end

-- The limb path: any state, argument or time.
local cost, margin = NA(ARGV[ARG_COST]), NA(ARGV[ARG_MARGIN])
if not cost or iszero(cost) or not margin then return fail('invalid argument') end

local MAXT = {7387904, 8601842, 46116} -- 2^62 ns: MaxTime
local now
if tm then
  now = fromtime(tm[1], tm[2])
else
  now = N(ARGV[ARG_NOW])
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

if alg == ALG_SUB then
  -- Buckets of g = W/k ns: the state is the latest bucket's index sc and
  -- the counts of buckets sc-k+1 to sc, oldest first; a bucket before the
  -- origin holds nothing.
  local w, cap, kk = NA(ARGV[ARG_WINDOW]), NA(ARGV[ARG_CAPACITY]), NA(ARGV[ARG_BUCKETS])
  if not (w and cap and kk) or iszero(w) or iszero(kk) or #kk > 1 or kk[1] > 60 then
    return fail('invalid argument')
  end
  -- '1' counts refusals; '2' (a composite's step, which never spends a
  -- refusal) counts none but reads the states of a rule that does.
  local k, refused, counts = kk[1], ARGV[ARG_REFUSED] ~= '0', ARGV[ARG_REFUSED] == '1'
  -- A state in debt (after a settlement) holds up to twice the capacity.
  local cap2 = add(cap, cap)
  local g, gr = divmod(w, kk)
  if not iszero(gr) then return fail('invalid argument') end
  local win, e = divtime(now, g)
  -- Each count is kept with its text (as canonical as S writes it), so
  -- that a count carried over is not written out again.
  local sc, a, at = Z, {}, {}
  for i = 1, k do a[i], at[i] = Z, '0' end
  if not fresh then
    if #f ~= k + 2 then return fail('invalid state') end
    sc = f[2]
    if cmp(sc, win) > 0 then return fail('invalid state') end
    local sum = Z
    for i = 1, k do
      local n = f[i + 2]
      if not iszero(n) then
        if cmp(n, cap2) > 0 or cmp(add(sc, {i}), kk) < 0 then return fail('invalid state') end
        sum = add(sum, n)
        if not refused and cmp(sum, cap2) > 0 then return fail('invalid state') end
        a[i], at[i] = n, fs[i + 2]
      end
    end
  end
  -- The counts seen from bucket win: shifted on by win - sc buckets.
  local d = sub(win, sc)
  local b, bt, sum = {}, {}, Z
  local shift = cmp(d, kk) < 0 and d[1]
  for i = 1, k do
    b[i], bt[i] = Z, '0'
    if shift and a[i + shift] then b[i], bt[i] = a[i + shift], at[i + shift] end
    if not iszero(b[i]) then sum = add(sum, b[i]) end
  end
  local put = nil
  if cmp(add(sum, cost), cap) <= 0 then
    admitted, put = 1, add(b[k], cost)
  elseif counts then
    local nc = add(b[k], cost)
    if cmp(nc, cap) > 0 then nc = cap end
    if cmp(nc, b[k]) > 0 then put = nc end
  end
  local last, out, outt = sc, a, at
  if put then
    b[k], bt[k] = put, S(put)
    last, out, outt = win, b, bt
  end
  local parts, any = {S(now), S(last)}, false
  for i = 1, k do
    parts[i + 2] = outt[i]
    if not iszero(out[i]) then any = true end
  end
  -- The newest bucket that may hold anything leaves the window at bucket
  -- last + k.
  -- That is (last + k - win) g - e from now (now is win g + e), with
  -- last + k - win at most k, and none when it is not above 0 (e < g).
  ttl = Z
  local left = add(last, kk)
  if any and cmp(left, win) > 0 then ttl = sub(muls(g, sub(left, win)[1]), e) end
  new = table.concat(parts, ' ')
elseif alg == ALG_FIXED or alg == ALG_COUNTER or alg == ALG_LOG then
  local w, cap = NA(ARGV[ARG_WINDOW]), NA(ARGV[ARG_CAPACITY])
  if not (w and cap) or iszero(w) then return fail('invalid argument') end
  -- A state in debt (after a settlement) holds up to twice the capacity.
  local cap2 = add(cap, cap)
  if alg == ALG_FIXED then
    local win, e = divtime(now, w)
    local sw, sc = Z, Z
    if not fresh then
      if #f ~= 3 then return fail('invalid state') end
      sw, sc = f[2], f[3]
      if cmp(sw, add(win, ONE)) > 0 or cmp(sc, cap2) > 0 then return fail('invalid state') end
    end
    -- A count in the window after now's, as a Plans' move writes it (the
    -- fast path declines it), applies from now on, to that window's end.
    local ahead = cmp(sw, win) > 0
    if ahead then win = sw end
    local count = Z
    if cmp(win, sw) == 0 then count = sc end
    local used = add(count, cost)
    if cmp(used, cap) <= 0 then
      admitted, sw, sc = 1, win, used
    end
    -- (win + 1) w - now: w - e, now being win w + e, or a window more
    -- when win is the one after now's.
    ttl = sub(w, e)
    if ahead then ttl = add(ttl, w) end
    new = S(now) .. ' ' .. S(sw) .. ' ' .. S(sc)
  elseif alg == ALG_COUNTER then
    local win, e = divtime(now, w)
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
    elseif ARGV[ARG_REFUSED] == '1' then
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
redis.call('SET', key, new, 'PX', string.format('%d', ceilms(ttl) + tonumber(ARGV[ARG_MARGIN])))
return {old, reading, new, admitted}

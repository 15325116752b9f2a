-- The step of the window rules, exact for any state, argument or time: the
-- end of the body of exact(key, alg, old, tm), which the script defines
-- around pairs.lua, arith.lua and this file so that a check the fast path
-- decides never builds these functions (a library defines pairs.lua's and
-- arith.lua's once, when it loads). The buckets have returned by pmeter
-- (pairs.lua) before this runs. old is the key's value or false, tm TIME's
-- reply or false. It returns the step's four fields as four values, as
-- pmeter does (see step.lua), or an error reply.
--
-- Every quantity is below 2^63 (a sum of two below 2^64, of a sub-window's
-- counts below 2^70) and is kept as a pair of doubles (pairs.lua), which
-- adds, subtracts and compares exactly without a table; only the window of
-- an instant (pdivtime) and the sliding counter's products, where doubles
-- cannot show them exactly, go through limbs (arith.lua).

local fail = pfail

local ch, cl = ppa(ARGV[ARG_COST])
local mh, ml = ppa(ARGV[ARG_MARGIN])
if not (ch and mh) or (ch == 0 and cl == 0) then return fail('invalid argument') end

local wh, wl, reading = pnow(tm)
if not wh then return fail('invalid argument') end
-- now as written: the reading, or the state's latest instant when later.
local nows = reading

-- The state: space-separated canonical decimals, the latest instant first.
-- An empty value is a fresh key's, as for the Machine. The fixed window
-- and the sliding counter have a shape of their own (or a fresh key's
-- lone instant); the others a list, fh, fl and their texts fs.
local nf, f2, f3, f4 = 0, nil, nil, nil
local fh, fl, fs
if old and #old > 0 then
  local f1
  if alg == ALG_FIXED or alg == ALG_COUNTER then
    if alg == ALG_FIXED then
      f1, f2, f3 = string.match(old, '^(%d+) (%d+) (%d+)$')
      nf = 3
    else
      f1, f2, f3, f4 = string.match(old, '^(%d+) (%d+) (%d+) (%d+)$')
      nf = 4
    end
    if not f1 then
      f1, nf = string.match(old, '^%d+$'), 1
      if not f1 then return fail('invalid state') end
    end
    -- Canonical decimals compare as numbers by length, then as strings:
    -- the latest instant needs reading only when it is later than now
    -- (one no later is a valid time).
    local n1, nn = #f1, #reading
    if n1 > 1 and string.byte(f1, 1) == 48 then return fail('invalid state') end
    if n1 < nn or (n1 == nn and f1 <= reading) then f1 = nil end
  else
    if string.find(old, '[^ 0-9]') or string.find(old, '  ') or string.byte(old, 1) == 32 or string.byte(old, -1) == 32 then
      return fail('invalid state')
    end
    fh, fl, fs = {}, {}, {}
    for w in string.gmatch(old, '%d+') do
      local h, l = pp(w, true)
      if not h then return fail('invalid state') end
      nf = nf + 1
      fh[nf], fl[nf], fs[nf] = h, l, w
    end
    f1 = fs[1]
  end
  if f1 then
    local h, l = pp(f1, true)
    if not h or pcmp(h, l, 4611686018, 427387904) > 0 then return fail('invalid state') end
    if pcmp(h, l, wh, wl) > 0 then wh, wl, nows = h, l, f1 end
  end
else
  old = old or ''
end
-- A state with nothing after its instant is a fresh key's.
local fresh = nf <= 1

local Wh, Wl = ppa(ARGV[ARG_WINDOW])
local ah, al = ppa(ARGV[ARG_CAPACITY])
if not (Wh and ah) or (Wh == 0 and Wl == 0) then return fail('invalid argument') end
-- A state in debt (after a settlement) holds up to twice the capacity.
local a2h, a2l = padd(ah, al, ah, al)

local admitted, new, th, tl = 0, nil, 0, 0

if alg == ALG_SUB then
  -- Buckets of g = W/k ns: the state is the latest bucket's index sc and
  -- the counts of buckets sc-k+1 to sc, oldest first (fields 3 to k + 2);
  -- a bucket before the origin holds nothing.
  local kh, k = ppa(ARGV[ARG_BUCKETS])
  if not kh or kh ~= 0 or k == 0 or k > 60 then return fail('invalid argument') end
  -- '1' counts refusals; '2' (a composite's step, which never spends a
  -- refusal) counts none but reads the states of a rule that does.
  local refused, counts = ARGV[ARG_REFUSED] ~= '0', ARGV[ARG_REFUSED] == '1'
  -- g = W/k, exactly: the remainder of W's high part carried into its low.
  local gr = math.fmod(Wh, k)
  local x = gr * 1000000000 + Wl
  local gl = math.fmod(x, k)
  if gl ~= 0 then return fail('invalid argument') end
  local gh
  gh, gl = (Wh - gr) / k, (x - gl) / k
  local nh, nl, eh, el = pdivtime(wh, wl, gh, gl)
  -- any: a count is not zero.
  local sh, sl, any = 0, 0, false
  if not fresh then
    if nf ~= k + 2 then return fail('invalid state') end
    sh, sl = fh[2], fl[2]
    if pcmp(sh, sl, nh, nl) > 0 then return fail('invalid state') end
    local uh, ul = 0, 0
    for i = 1, k do
      local h, l = fh[i + 2], fl[i + 2]
      if h ~= 0 or l ~= 0 then
        if pcmp(h, l, a2h, a2l) > 0 or (sh == 0 and sl + i < k) then return fail('invalid state') end
        uh, ul = padd(uh, ul, h, l)
        if not refused and pcmp(uh, ul, a2h, a2l) > 0 then return fail('invalid state') end
        any = true
      end
    end
  end
  -- The counts seen from bucket n: shifted on by n - sc buckets, the
  -- count of bucket n - k + i being field i + shift + 2 (none past the
  -- last, k + 2); b the last's, bucket n's.
  local dh, dl = psubp(nh, nl, sh, sl)
  local shift = any and dh == 0 and dl < k and dl
  local uh, ul, bh, bl = 0, 0, 0, 0
  if shift then
    for j = shift + 3, k + 2 do uh, ul = padd(uh, ul, fh[j], fl[j]) end
    if shift == 0 then bh, bl = fh[k + 2], fl[k + 2] end
  end
  local put, ph, pl = false, 0, 0
  local xh, xl = padd(uh, ul, ch, cl)
  if pcmp(xh, xl, ah, al) <= 0 then
    admitted, put = 1, true
    ph, pl = padd(bh, bl, ch, cl)
  elseif counts then
    ph, pl = padd(bh, bl, ch, cl)
    if pcmp(ph, pl, ah, al) > 0 then ph, pl = ah, al end
    put = pcmp(ph, pl, bh, bl) > 0
  end
  -- The state written: the shifted counts with bucket n's put (never
  -- zero), or else the state's counts as they were.
  local lh, ll = sh, sl
  if put then
    lh, ll, any = nh, nl, true
    local parts = {nows, pstr(nh, nl)}
    for i = 1, k - 1 do
      parts[i + 2] = shift and fs[i + shift + 2] or '0'
    end
    parts[k + 2] = pstr(ph, pl)
    new = table.concat(parts, ' ')
  elseif fresh then
    new = nows .. ' 0' .. string.rep(' 0', k)
  else
    new = nows .. string.sub(old, #fs[1] + 1)
  end
  -- The newest bucket that may hold anything leaves the window at bucket
  -- last + k: that is (last + k - n) g - e from now (now is n g + e),
  -- with last + k - n at most k, and none when it is not above 0 (e < g).
  if any then
    local xh, xl = padd(lh, ll, 0, k)
    local mh2, m = 0, 0
    if pcmp(xh, xl, nh, nl) > 0 then mh2, m = psubp(xh, xl, nh, nl) end
    if mh2 == 0 and m > 0 then
      -- g m - e, with m at most k: each part's product is exact.
      local y = gl * m
      local r = math.fmod(y, 1000000000)
      th, tl = psubp(gh * m + (y - r) / 1000000000, r, eh, el)
    end
  end
elseif alg == ALG_FIXED then
  local nh, nl, eh, el = pdivtime(wh, wl, Wh, Wl)
  local sh, sl, oh, ol = 0, 0, 0, 0
  local sws, scs = '0', '0'
  if not fresh then
    sws, scs = f2, f3
    oh, ol = pp(f3, true)
    sh, sl = pp(f2, true)
    if not (sh and oh) then return fail('invalid state') end
    local n1h, n1l = padd(nh, nl, 0, 1)
    if pcmp(sh, sl, n1h, n1l) > 0 or pcmp(oh, ol, a2h, a2l) > 0 then return fail('invalid state') end
  end
  -- A count in the window after now's, as a Plans' move writes it (the
  -- fast path declines it), applies from now on, to that window's end.
  local ahead = pcmp(sh, sl, nh, nl) > 0
  if ahead then nh, nl = sh, sl end
  local uh, ul = ch, cl
  if sh == nh and sl == nl then uh, ul = padd(oh, ol, ch, cl) end
  if pcmp(uh, ul, ah, al) <= 0 then
    admitted, sws, scs = 1, pstr(nh, nl), pstr(uh, ul)
  end
  -- (n + 1) W - now: W - e, now being n W + e, or a window more when n
  -- is the one after now's.
  th, tl = psubp(Wh, Wl, eh, el)
  if ahead then th, tl = padd(th, tl, Wh, Wl) end
  new = nows .. ' ' .. sws .. ' ' .. scs
elseif alg == ALG_COUNTER then
  local nh, nl, eh, el = pdivtime(wh, wl, Wh, Wl)
  local sh, sl, ph, pl, uh, ul = 0, 0, 0, 0, 0, 0
  local sws, sps, scs = '0', '0', '0'
  if not fresh then
    sws, sps, scs = f2, f3, f4
    sh, sl = pp(f2, true)
    ph, pl = pp(f3, true)
    uh, ul = pp(f4, true)
    if not (sh and ph and uh) then return fail('invalid state') end
    if pcmp(sh, sl, nh, nl) > 0 or pcmp(ph, pl, a2h, a2l) > 0 or pcmp(uh, ul, a2h, a2l) > 0 then
      return fail('invalid state')
    end
  end
  -- prev and cur, with prev's text.
  local vh, vl, rh, rl, vs = 0, 0, 0, 0, '0'
  if sh == nh and sl == nl then
    vh, vl, rh, rl, vs = ph, pl, uh, ul, sps
  else
    local s1h, s1l = padd(sh, sl, 0, 1)
    if s1h == nh and s1l == nl then vh, vl, vs = uh, ul, scs end
  end
  -- estimate + cost <= capacity  <=>  prev*(W-e) <= (capacity-cur-cost)*W
  local xh, xl = padd(rh, rl, ch, cl)
  local fits = pcmp(xh, xl, ah, al) <= 0
  if fits and (vh ~= 0 or vl ~= 0) then
    local bh, bl = psubp(Wh, Wl, eh, el)
    local dh, dl = psubp(ah, al, xh, xl)
    -- In doubles where both products are below 2^53 (a rounded product
    -- below 2^53 is an exact one), else in limbs.
    local p, q = (vh * 1000000000 + vl) * (bh * 1000000000 + bl), (dh * 1000000000 + dl) * (Wh * 1000000000 + Wl)
    if p < 9007199254740992 and q < 9007199254740992 then
      fits = p <= q
    else
      fits = cmp(mul(plimbs(vh, vl), plimbs(bh, bl)), mul(plimbs(dh, dl), plimbs(Wh, Wl))) <= 0
    end
  end
  if fits then
    admitted, rh, rl = 1, xh, xl
    sws, sps, scs = pstr(nh, nl), vs, pstr(xh, xl)
  elseif ARGV[ARG_REFUSED] == '1' then
    -- CountRefused: the refusal spends too, the count capped at the
    -- capacity; a count above it (a debt) stays as it is.
    if pcmp(xh, xl, ah, al) > 0 then
      xh, xl = ah, al
      if pcmp(rh, rl, ah, al) > 0 then xh, xl = rh, rl end
    end
    rh, rl = xh, xl
    sws, sps, scs = pstr(nh, nl), vs, pstr(xh, xl)
  end
  if rh ~= 0 or rl ~= 0 then
    th, tl = padd(Wh, Wl, Wh, Wl)
    th, tl = psubp(th, tl, eh, el)
  elseif vh ~= 0 or vl ~= 0 then
    th, tl = psubp(Wh, Wl, eh, el)
  end
  new = nows .. ' ' .. sws .. ' ' .. sps .. ' ' .. scs
elseif alg == ALG_LOG then
  -- Entries t cost, oldest first, at strictly increasing instants no
  -- later than now; those with t + W <= now have expired (k is the first
  -- live one).
  local m = nf
  if m > 0 and m % 2 ~= 1 then return fail('invalid state') end
  local k, uh, ul = m + 1, 0, 0
  for i = 2, m, 2 do
    local h, l, c1, c2 = fh[i], fl[i], fh[i + 1], fl[i + 1]
    if pcmp(h, l, wh, wl) > 0 or (i > 2 and pcmp(fh[i - 2], fl[i - 2], h, l) >= 0) or (c1 == 0 and c2 == 0)
        or pcmp(c1, c2, a2h, a2l) > 0 then
      return fail('invalid state')
    end
    local eh, el = padd(h, l, Wh, Wl)
    if pcmp(eh, el, wh, wl) > 0 then
      if k > m then k = i end
      uh, ul = padd(uh, ul, c1, c2)
    end
  end
  if pcmp(uh, ul, a2h, a2l) > 0 then return fail('invalid state') end
  local parts = {nows}
  local xh, xl = padd(uh, ul, ch, cl)
  if pcmp(xh, xl, ah, al) <= 0 then
    admitted = 1
    local last = m - 1
    local merge = k < m and fh[last] == wh and fl[last] == wl
    for i = k, m, 2 do
      if merge and i == last then
        parts[#parts + 1] = fs[i] .. ' ' .. pstr(padd(fh[i + 1], fl[i + 1], ch, cl))
      else
        parts[#parts + 1] = fs[i] .. ' ' .. fs[i + 1]
      end
    end
    if not merge then parts[#parts + 1] = nows .. ' ' .. pstr(ch, cl) end
    th, tl = Wh, Wl
  else
    for i = 2, m do parts[#parts + 1] = fs[i] end
    th, tl = padd(fh[m - 1], fl[m - 1], Wh, Wl)
    th, tl = psubp(th, tl, wh, wl)
  end
  new = table.concat(parts, ' ')
else
  return fail('invalid argument')
end

-- Keep the state until it is as good as a fresh key's, plus the margin.
pkeep(key, new, th, tl, mh, ml)
return old, reading, new, admitted

-- A library's check takes its arguments packed (see packedArgs): ARGV[1]
-- the text of every argument but now, in their order, each after a space
-- (the step's code first, then the cost, the margin and the rule's own),
-- and ARGV[2] now, or nothing for the server's TIME ('', as a script
-- takes it). Redis spends on each argument a command carries, and a
-- rule's check sends the same text every time (for one cost), so the
-- library reads each text once: funpack keeps, by text, the arguments as
-- the script takes them (ARGV[ARG_NOW] is set on each call), at most 256
-- texts, then starts afresh. The steps read that table as they read a
-- script's ARGV, so that both forms decide alike; the fast path finds in
-- its field v the numbers it would read from each (see fast).
--
-- A text is taken only when it is well formed: a step's code the table
-- has, followed by exactly as many canonical decimals below 2^63 as that
-- step takes (packArity, the count of its arguments with now). Anything
-- else is nil, which the caller turns
-- into an error: no check is ever decided on a text the store would not
-- have sent. What a kept table holds depends on its text alone, and only
-- ARGV[ARG_NOW] is written to it after.
local packArity = PACKED_ARITY
local packCache, packCached = {}, 0
local function funpack(s, now)
  local a = packCache[s]
  if a then
    a[ARG_NOW] = now
    return a
  end
  if type(s) ~= 'string' then return nil end
  local alg = string.match(s, '^(%a) ')
  local want = alg and packArity[alg]
  if not want then return nil end
  a = {alg}
  local n, at = 1, 3
  while at <= #s do
    local f = string.match(s, '^%d+', at)
    if not f then return nil end
    if not pp(f, true) then return nil end -- canonical, below 2^63
    at = at + #f
    n = n + 1
    a[n] = f
    if at <= #s then
      if string.byte(s, at) ~= 32 or at == #s then return nil end
      at = at + 1
    end
  end
  if n + 1 ~= want then return nil end
  table.insert(a, ARG_NOW, now)
  -- What the fast path's farg reads of each argument, by position.
  local v = {}
  for i = ARG_COST, n + 1 do v[i] = farg(a[i]) end
  a.v = v
  if packCached >= 256 then packCache, packCached = {}, 0 end
  packCache[s], packCached = a, packCached + 1
  return a
end

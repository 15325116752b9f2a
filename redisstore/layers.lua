-- One request on several limits, atomically and all or nothing: read every
-- layer's state, agree on one instant (now raised to every state's latest
-- instant), look at each layer with its own step (layerstep, the step of a
-- single key with its write held back), and write the layers' new states
-- only if every enforced layer admits; a refused request writes nothing.
--
-- KEYS[i]  layer i's state
-- ARGV[1]  now in ns since the Unix epoch, or '' for the server's TIME
-- ARGV[2]  the number of layers
-- then per layer: 'e' (enforced), 's' (shadow) or '-' (a shadow layer that
-- sits the request out), the number k of its step's arguments, and those k
-- arguments as step.lua takes them (ARGV[ARG_NOW], now, is set here).
--
-- Returns {instant, 1 if every enforced layer admits else 0, then per
-- layer: old state or '', new state written or '' if none}. A state a
-- layer's step refuses is that step's error reply, and nothing is written.

local function later(a, b)
  return #a > #b or (#a == #b and a > b)
end

local now = ARGV[1]
if now == '' then
  local tm = redis.call('TIME')
  now = string.format('%d%09d', tonumber(tm[1]), tonumber(tm[2]) * 1000)
end
local n, pos = tonumber(ARGV[2]), 3
local layers = {}
for i = 1, n do
  local flag, k = ARGV[pos], tonumber(ARGV[pos + 1])
  local args = {}
  for j = 1, k do args[j] = ARGV[pos + 1 + j] end
  pos = pos + 2 + k
  local old = false
  if flag ~= '-' then
    old = redis.call('GET', KEYS[i])
    if old then
      local last = string.match(old, '^%d+')
      if last and later(last, now) then now = last end
    end
  end
  layers[i] = {flag = flag, args = args, old = old}
end

-- Look.
local real = redis
local admitted = true
for i = 1, n do
  local l = layers[i]
  if l.flag ~= '-' then
    local held = {}
    local hold = setmetatable({call = function(cmd, key, v, px, ms)
      if cmd == 'SET' then
        held.v, held.ms = v, ms
        return true
      end
      return real.call(cmd, key, v, px, ms)
    end}, {__index = real})
    l.args[ARG_NOW] = now
    local r = layerstep(l.args, hold, KEYS[i], l.old)
    if r.err then return r end
    l.r, l.held = r, held
    if l.flag == 'e' and r[4] ~= 1 then admitted = false end
  end
end

-- Commit: every enforced layer, and every shadow layer that admits itself.
local out = {now, admitted and 1 or 0}
for i = 1, n do
  local l = layers[i]
  local written = ''
  if admitted and l.flag ~= '-' and (l.flag == 'e' or l.r[4] == 1) then
    redis.call('SET', KEYS[i], l.held.v, 'PX', l.held.ms)
    written = l.held.v
  end
  out[#out + 1] = l.old or ''
  out[#out + 1] = written
end
return out

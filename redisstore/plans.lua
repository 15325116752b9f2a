-- A check of one key of a rule set of plans (see Plans), atomically: read
-- the key's record, which names the keys that hold its state. If it names
-- the keys of the plan the check is under, or the key has none, run that
-- plan's check (single, step.lua's; layered, layers.lua's) and keep the
-- record at least as long as any state the check wrote. If it names other
-- keys, write nothing: return the record, the states of the keys it names
-- and of the plan's keys, for Go to compute the key's move with the core's
-- MoveState. A move ('m') writes what Go computed over the old keys, the
-- plan's keys and the record, if all still hold what was read, and then
-- checks.
--
-- KEYS[1]        the key's record
-- KEYS[2..n+1]   the plan's keys, in layer order
-- 'm': KEYS[n+2..n+k+1] the keys the record named that are not the plan's
-- ARGV[1]  'c' check; 'm' move, then check; 'z' reset (see below)
-- ARGV[2]  the operation once the record names the plan's keys: 's' a
--          check of a plan of one rule; 'l' a check of a plan of layers;
--          'x' a refund or settlement (settle.lua's); 'o' a read (ops.lua's)
-- ARGV[3]  the plan's record but for its last line: the plan's keys,
--          separated by single spaces, a newline and the plan as JSON
-- ARGV[4]  n, the number of the plan's keys (for 'z', see below)
-- ARGV[5]  the prefix that every key a record names starts with
-- ARGV[6]  now in ns since the Unix epoch, or '' for the server's TIME,
--          as the check's own arguments say it
-- ARGV[7]  the index of the operation's first argument: step.lua's
--          arguments for 's', layers.lua's for 'l', from there to the end;
--          for 'x' and 'o', a mask of the plan's keys the operation takes
--          ('1' or '0' per key, in layer order), then settle.lua's or
--          ops.lua's arguments
-- 'm':     ARGV[8] the record as read ('' none), ARGV[9] the record to
--          write (the same to leave it), ARGV[10] its expiry in ms, ARGV[11]
--          k; then per plan's
--          key: its state as read, the state to write ('' to leave it),
--          its expiry in ms; then per old key: its state as read, '1' to
--          delete it ('' to leave it).
--
-- 'z':     KEYS[2..n+1] the plan's keys, then the key's own keys of the
--          set's other plans; ARGV[8] the part of a key's name after a
--          plan's layer's head that the key's own keys end with (a layer
--          without a Key); ARGV[9] how a record's second line starts when it
--          names a plan of the same name as the key's ('{"plan":' and the
--          name). Those n keys, every key the record names that is the
--          key's own (or every key it names, when it names an earlier
--          version of the key's plan: its shared keys wait to move into the
--          plan's), and the record are deleted, as in process a reset drops
--          the key's entries; returns {'z'}.
--
-- A record is three lines: the keys of the plan that holds the key's
-- state, the plan as JSON, and what the key's last move carried into the
-- plan's first layer (see ratelimit.MoveState), or an empty last line.
--
-- Returns {'c', then the operation's reply as step.lua, layers.lua,
-- settle.lua or ops.lua returns it}; {'m', the instant (before clamping), the record, the number of keys
-- it names, their states, then the plan's keys' states} (a state '' for
-- none); {'a'} for a move whose keys no longer hold what was read. A
-- record or state of another type than a string, or a record that is not
-- well formed, is an error reply, and nothing is written.

local function get(k)
  local v = redis.pcall('GET', k)
  if type(v) == 'table' then return nil, tostring(v.err) end
  return v or '', nil
end

local n, prefix = tonumber(ARGV[4]), ARGV[5]
local id = ARGV[3] .. '\n'
local rec, err = get(KEYS[1])
if err then return redis.error_reply('RATELIMIT invalid record: ' .. err) end

if ARGV[1] == 'z' then
  -- The plan's keys and the key's own keys of the set's other plans, and
  -- the key's own keys the record names (a layer with a Key shares its key
  -- with other keys: it stays as it is, unless the record names an earlier
  -- version of the key's plan).
  for i = 1, n do redis.call('DEL', KEYS[i + 1]) end
  local own, same = ARGV[8], ARGV[9]
  local nl = string.find(rec, '\n', 1, true)
  if nl then
    local all = string.sub(rec, nl + 1, nl + #same) == same
    for w in string.gmatch(string.sub(rec, 1, nl - 1), '[^ ]+') do
      if #w > #prefix and string.sub(w, 1, #prefix) == prefix and (all or (#w > #own and string.sub(w, -#own) == own)) then
        redis.call('DEL', w)
      end
    end
  end
  redis.call('DEL', KEYS[1])
  return {'z'}
end

if ARGV[1] == 'm' then
  local k = tonumber(ARGV[11])
  if rec ~= ARGV[8] then return {'a'} end
  local pos = 12
  for i = 2, n + k + 1 do
    local v, e = get(KEYS[i])
    if e then return redis.error_reply('RATELIMIT invalid state: ' .. e) end
    if v ~= ARGV[pos] then return {'a'} end
    pos = pos + (i <= n + 1 and 3 or 2)
  end
  pos = 12
  for i = 2, n + k + 1 do
    if i <= n + 1 then
      if ARGV[pos + 1] ~= '' then redis.call('SET', KEYS[i], ARGV[pos + 1], 'PX', ARGV[pos + 2]) end
      pos = pos + 3
    else
      if ARGV[pos + 1] == '1' then redis.call('DEL', KEYS[i]) end
      pos = pos + 2
    end
  end
  if ARGV[9] ~= rec then
    rec = ARGV[9]
    redis.call('SET', KEYS[1], rec, 'PX', ARGV[10])
  end
elseif rec ~= '' and string.sub(rec, 1, #id) ~= id then
  local nl = string.find(rec, '\n', 1, true)
  if not nl then return redis.error_reply('RATELIMIT invalid record: no keys') end
  local now = ARGV[6]
  if now == '' then
    local tm = redis.call('TIME')
    now = string.format('%d%09d', tonumber(tm[1]), tonumber(tm[2]) * 1000)
  end
  local out = {'m', now, rec, 0}
  local line, count = string.sub(rec, 1, nl - 1), 0
  if string.find(line, '^ ') or string.find(line, '  ') or string.find(line, ' $') then
    return redis.error_reply('RATELIMIT invalid record: keys not separated by single spaces')
  end
  for w in string.gmatch(line, '[^ ]+') do
    count = count + 1
    if count > 64 or #w > 512 or string.sub(w, 1, #prefix) ~= prefix or string.byte(w, -1) ~= 125 then
      return redis.error_reply('RATELIMIT invalid record: it names a key no plan has')
    end
    local v, e = get(w)
    if e then return redis.error_reply('RATELIMIT invalid state: ' .. e) end
    out[#out + 1] = v
  end
  if count == 0 then return redis.error_reply('RATELIMIT invalid record: no keys') end
  out[4] = count
  for i = 2, n + 1 do
    local v, e = get(KEYS[i])
    if e then return redis.error_reply('RATELIMIT invalid state: ' .. e) end
    out[#out + 1] = v
  end
  return out
end

-- The check, through a client that notes the longest expiry it sets.
local longest = false
local real = redis
local noting = setmetatable({call = function(cmd, ...)
  local a = {...}
  if cmd == 'SET' and a[3] == 'PX' then
    local ms = tonumber(a[4])
    if ms and (not longest or ms > longest) then longest = ms end
  end
  return real.call(cmd, ...)
end}, {__index = real})
local keys, args = {}, {}
local first, kind = tonumber(ARGV[7]), ARGV[2]
if kind == 'x' or kind == 'o' then
  -- The keys the mask names.
  local mask = ARGV[first]
  for i = 1, n do
    if string.sub(mask, i, i) == '1' then keys[#keys + 1] = KEYS[i + 1] end
  end
  first = first + 1
else
  for i = 1, n do keys[i] = KEYS[i + 1] end
end
for j = first, #ARGV do args[#args + 1] = ARGV[j] end
local r
if kind == 's' then
  r = single(keys, args, noting)
elseif kind == 'l' then
  r = layered(keys, args, noting)
elseif kind == 'x' then
  r = settled(keys, args, noting)
else
  r = ops(keys, args, noting)
end
if type(r) == 'table' and r.err then return r end
if longest then
  if rec ~= '' then
    redis.call('PEXPIRE', KEYS[1], string.format('%d', longest), 'GT')
  else
    redis.call('SET', KEYS[1], id, 'PX', string.format('%d', longest))
  end
end
local out = {'c'}
if type(r) == 'string' then
  out[2] = r -- a single plan's step: its reply joined in one text (step.lua)
else
  for i = 1, #r do out[i + 1] = r[i] end
end
return out

-- The after-the-fact operations that need no arithmetic in Redis (Peek and
-- Reset) on one key or on a composite's layer keys, which share a slot:
-- read the keys' states and the instant, or reset the keys. A peek's
-- arithmetic is done in Go by the rules' Machines; this script only reads
-- and writes whole states, atomically.
--
-- KEYS     the keys
-- ARGV[1]  now in ns since the Unix epoch, or '' for the server's TIME
-- ARGV[2]  'r' read; 'z' reset
-- 'z':     ARGV[3] the expiry margin in ms. Every key that exists is
--          replaced by the state of a fresh key that keeps the key's clamp
--          on time, its latest instant and nothing else, expiring after the
--          margin (a check on such a state would set that expiry too); a
--          key whose state is not well formed, or of another type than a
--          string, has no clamp to keep, and is deleted. ARGV[4] is an
--          instant the store used for the keys without telling Redis (its
--          deny cache's), '0' if none: the clamp kept is at least that.
--
-- Returns {1, the instant (before clamping), then for 'r' each key's state
-- or '' as read}. A key of another type than a string is, but for 'z', an
-- error reply.

local function later(a, b)
  return #a > #b or (#a == #b and a > b)
end

local now = ARGV[1]
if now == '' then
  local tm = redis.call('TIME')
  now = string.format('%d%09d', tonumber(tm[1]), tonumber(tm[2]) * 1000)
end
local mode = ARGV[2]
-- A key that holds another type than a string (a hash, a list, ...) is a
-- corrupted state: a reset deletes it, anything else is refused.
local cur, wrong = {}, {}
for i = 1, #KEYS do
  local v = redis.pcall('GET', KEYS[i])
  if type(v) == 'table' then
    if mode ~= 'z' then return redis.error_reply('RATELIMIT invalid state: ' .. tostring(v.err)) end
    v, wrong[i] = '', true
  end
  cur[i] = v
end

if mode == 'z' then
  for i = 1, #KEYS do
    if cur[i] then
      -- The latest instant, if it is a canonical decimal within MaxTime;
      -- a state that is not well formed keeps no clamp.
      local last = not wrong[i] and string.match(cur[i], '^%d+')
      if last and (#last == 1 or string.byte(last, 1) ~= 48) and not later(last, '4611686018427387904') then
        if later(ARGV[4], last) then last = ARGV[4] end
        redis.call('SET', KEYS[i], last, 'PX', ARGV[3])
      else
        redis.call('DEL', KEYS[i])
      end
    end
  end
  return {1, now}
end

local out = {1, now}
for i = 1, #KEYS do out[#out + 1] = cur[i] or '' end
return out

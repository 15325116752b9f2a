local layerstep = nil
-- An in-flight limit's slots, atomically: take one if fewer than the limit
-- are held (and, for AcquireWith, only if the rate limit admits), give one
-- back, or count them.
--
-- The slots of a key are one sorted set, every score 0, so that its
-- members are ordered as bytes: '<until>:<id>' for each slot held, until
-- the instant MaxHold takes it back in 19 digits (zero-padded, so that the
-- order of the members is the order of the instants, exactly, with no
-- number ever read whole), and one '~<latest>', the latest instant the key
-- was stepped at, which sorts after every slot. A slot whose until is at
-- most now is no longer held: ZREMRANGEBYLEX drops them all, from '-' up
-- to '<now>;' (':' sorts before ';'), exactly.
--
-- KEYS[1]  the slots
-- KEYS[2]  AcquireWith only: the rate limit's state (the same hash tag)
-- ARGV[1]  'a' to acquire, 'r' to release, 'n' to count
-- ARGV[2]  now in ns since the Unix epoch, or '' for the server's TIME
-- acquire: ARGV[3] the limit, ARGV[4] and ARGV[5] MaxHold's seconds and
--          nanoseconds ('' and '' for none), ARGV[6] the slot's id,
--          ARGV[7] the expiry in ms ('' for none: the key is kept until
--          its slots are released), ARGV[8] the latest instant a slot may
--          end at (MaxTime, 19 digits); with KEYS[2], ARGV[9..] the rate
--          step's arguments as step.lua takes them (the second, now, is
--          set here)
-- release: ARGV[3] the slot's member
--
-- Returns, for an acquisition, {1 if taken else 0, the instant (19
-- digits), the slots held after it, the slot's member or ''} and, with
-- KEYS[2] and a slot free, the rate step's reply after them ({old state,
-- now, new state, 1 if admitted}); for a release, {1 if the slot was
-- held}; for a count, {0, the instant, the slots held}.

local key, op = KEYS[1], ARGV[1]
if op == 'r' then
  local n = redis.call('ZREM', key, ARGV[3])
  if n == 1 then
    local first = redis.call('ZRANGE', key, 0, 0)[1]
    if first and string.byte(first, 1) == 126 then
      -- Only the latest instant is left: the key is fresh.
      redis.call('DEL', key)
    end
  end
  return {n}
end

local now = ARGV[2]
if now == '' then
  local tm = redis.call('TIME')
  now = string.format('%d%09d', tonumber(tm[1]), tonumber(tm[2]) * 1000)
end
now = string.rep('0', 19 - #now) .. now
local latest = redis.call('ZRANGEBYLEX', key, '[~', '+', 'LIMIT', 0, 1)[1]
if latest and string.sub(latest, 2) > now then now = string.sub(latest, 2) end
local held = redis.call('ZLEXCOUNT', key, '(' .. now .. ';', '(~')
if op == 'n' then return {0, now, held} end

if held >= tonumber(ARGV[3]) then return {0, now, held, ''} end
local rate = false
if KEYS[2] then
  local args = {}
  for i = 9, #ARGV do args[#args + 1] = ARGV[i] end
  args[2] = string.match(now, '^0*(%d+)$')
  rate = layerstep(args, redis, KEYS[2], redis.call('GET', KEYS[2]))
  if rate.err then return rate end
  if rate[4] ~= 1 then return {0, now, held, '', rate[1], rate[2], rate[3], rate[4]} end
end

local untl = ARGV[8]
if ARGV[4] ~= '' then
  local h, l = tonumber(string.sub(now, 1, 10)), tonumber(string.sub(now, 11))
  l = l + tonumber(ARGV[5])
  if l >= 1000000000 then h, l = h + 1, l - 1000000000 end
  h = h + tonumber(ARGV[4])
  local u = string.format('%010d%09d', h, l)
  if #u == 19 and u < untl then untl = u end
end
local member = untl .. ':' .. ARGV[6]
redis.call('ZREMRANGEBYLEX', key, '-', '(' .. now .. ';')
if latest then redis.call('ZREM', key, latest) end
redis.call('ZADD', key, 0, member, 0, '~' .. now)
if ARGV[7] ~= '' then redis.call('PEXPIRE', key, ARGV[7]) end
if rate then return {1, now, held + 1, member, rate[1], rate[2], rate[3], rate[4]} end
return {1, now, held + 1, member}

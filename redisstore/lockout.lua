-- A lockout key's compare-and-set: the Go side decides on the state it read
-- with the rule's LockoutMachine, and writes its new state only if the key
-- still holds the state it decided on; else it decides again on the state
-- returned. So concurrent failures from any number of processes are counted
-- one after another, each on the state the one before left.
--
-- KEYS[1]  the key's state
-- ARGV[1]  'r' to read, 'w' to write
-- ARGV[2]  the state the write was decided on ('' for none)
-- ARGV[3]  the new state, or '' to delete the key (it is fresh)
-- ARGV[4]  the new state's expiry in ms
-- ARGV[5]  '1' to read the server's TIME, '' with a client clock
--
-- Returns {1 if written else 0, the state read or '', the server's time in
-- ns since the Unix epoch or ''}. The state is read before the write.

local cur = redis.call('GET', KEYS[1]) or ''
local now = ''
if ARGV[5] == '1' then
  local tm = redis.call('TIME')
  now = string.format('%d%09d', tonumber(tm[1]), tonumber(tm[2]) * 1000)
end
if ARGV[1] == 'w' and cur == ARGV[2] then
  if ARGV[3] == '' then
    redis.call('DEL', KEYS[1])
  else
    redis.call('SET', KEYS[1], ARGV[3], 'PX', ARGV[4])
  end
  return {1, cur, now}
end
return {0, cur, now}

-- Settles a row (RunState.mark_done / mark_skipped): sets its done bit and, only the first time,
-- adds to the dataset's counters and applies the row's other updates (its rate bucket, length
-- histogram, activity: common/rates.py `completion_updates`), so a task run twice (a worker died
-- after writing, before acking) is never counted twice, and a finished prompt costs one round trip.
-- KEYS: done bitmap, counters hash, then the keys the updates name.
-- ARGV: row, the number of counter pairs, (counter, amount) pairs, then updates of four values:
-- command, index into KEYS, field, value (EXPIRE: the value is the seconds; the field is unused).
-- Replies with the bit's old value. An unknown update is refused before anything is written.
local known = {EXPIRE = true, HINCRBY = true, HINCRBYFLOAT = true, HSET = true, HSETNX = true}
for i = 3 + 2 * tonumber(ARGV[2]), #ARGV, 4 do
  if not known[ARGV[i]] then
    return redis.error_reply('mark_done: unknown update ' .. tostring(ARGV[i]))
  end
end
local old = redis.call('SETBIT', KEYS[1], ARGV[1], 1)
if old == 0 then
  local pairs = tonumber(ARGV[2])
  local i = 3
  for _ = 1, pairs do
    redis.call('HINCRBY', KEYS[2], ARGV[i], ARGV[i + 1])
    i = i + 2
  end
  while i <= #ARGV do
    local command, key = ARGV[i], KEYS[tonumber(ARGV[i + 1])]
    if command == 'EXPIRE' then
      redis.call('EXPIRE', key, ARGV[i + 3])
    else
      redis.call(command, key, ARGV[i + 2], ARGV[i + 3])
    end
    i = i + 4
  end
end
return old

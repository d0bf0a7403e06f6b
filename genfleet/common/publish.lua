-- Publishes one batch of a dataset's tasks and records its rejections, atomically (RunState.publish).
-- KEYS: enqueued bitmap, done bitmap, counters hash, rejected hash, then one queue list per queue.
-- ARGV: tasks, rejections, event channel ('' for none), then per task (row, queue number from 1,
-- message, event), then per rejection (row, JSON entry).
-- Per task: skip it if its row is done or already enqueued (SETBIT returns the old bit, which also
-- makes two producers racing on one run safe), else LPUSH it onto its queue as kombu's Redis
-- transport does (Channel._put, kombu/transport/redis.py), PUBLISH its task-sent event, and forget an
-- old rejection of the row. Replies with the tasks pushed per queue, then claimed, then new rejections.
local tasks, rejections, channel = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
local pushed, claimed, unrejected = {}, 0, 0
for q = 1, #KEYS - 4 do pushed[q] = 0 end
local i = 4
for _ = 1, tasks do
  local row = ARGV[i]
  if redis.call('GETBIT', KEYS[2], row) == 1 or redis.call('SETBIT', KEYS[1], row, 1) == 1 then
    claimed = claimed + 1
  else
    local q = tonumber(ARGV[i + 1])
    redis.call('LPUSH', KEYS[4 + q], ARGV[i + 2])
    pushed[q] = pushed[q] + 1
    if channel ~= '' then redis.call('PUBLISH', channel, ARGV[i + 3]) end
    unrejected = unrejected + redis.call('HDEL', KEYS[4], row)
  end
  i = i + 4
end
local rejected = 0
for _ = 1, rejections do
  rejected = rejected + redis.call('HSET', KEYS[4], ARGV[i], ARGV[i + 1])
  i = i + 2
end
local total = 0
for q = 1, #pushed do total = total + pushed[q] end
if total > 0 then redis.call('HINCRBY', KEYS[3], 'total', total) end
if rejected ~= unrejected then redis.call('HINCRBY', KEYS[3], 'rejected', rejected - unrejected) end
pushed[#pushed + 1] = claimed
pushed[#pushed + 1] = rejected
return pushed

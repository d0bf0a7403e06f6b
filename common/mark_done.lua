-- Settles a row (RunState.mark_done / mark_skipped): sets its done bit and adds to the dataset's
-- counters only the first time, so a task run twice (a worker died after writing, before acking)
-- is never counted twice. KEYS: done bitmap, counters hash. ARGV: row, then (counter, amount) pairs.
-- Replies with the bit's old value.
local old = redis.call('SETBIT', KEYS[1], ARGV[1], 1)
if old == 0 then
  for i = 2, #ARGV, 2 do redis.call('HINCRBY', KEYS[2], ARGV[i], ARGV[i + 1]) end
end
return old

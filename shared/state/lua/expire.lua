-- expire: forget jobs that ended before ARGV[1] (a time; strictly before), the oldest first, at most ARGV[2] of
-- them: their hash and history are deleted and their id leaves ':jobs' and ':done'. Bounded so that one call
-- never blocks Redis long (the partitioner calls again while a call removed the limit). A ':done' entry whose
-- job is not terminal any more (cannot happen through set_state; the audit flags it) only leaves ':done': the
-- job is kept. Returns how many jobs were deleted.
local ids = redis.call('ZRANGEBYSCORE', DONE, '-inf', '(' .. ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
local n = 0
for _, job in ipairs(ids) do
  local st = redis.call('HGET', jk(job), 'state')
  -- no hash at all: only leftovers (history, ':jobs') remain, and they go too
  if not st or TERMINAL[st] then
    redis.call('DEL', jk(job), hk(job))
    redis.call('SREM', JOBS, job)
    n = n + 1
  end
  redis.call('ZREM', DONE, job)
end
return n

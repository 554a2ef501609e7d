-- expire: forget ended jobs, the oldest first, at most ARGV[2] of them: their hash and history are deleted and
-- their id leaves ':jobs' and ':done'. Two reasons to forget one: it ended strictly before ARGV[1] (the
-- retention), or the shard lists more than ARGV[3] ended jobs (a cap; 0 = none) and it is among the oldest
-- beyond that cap and ended strictly before ARGV[4] (the time before which no redelivered message can still
-- name it, so that the cap never breaks idempotency). Both reasons pick a prefix of ':done' in score order, so
-- the jobs forgotten are the longer prefix. Bounded so that one call never blocks Redis long (the node registry
-- calls again while a call removed the limit). A ':done' entry whose job is not terminal any more (cannot happen
-- through set_state; the audit flags it) only leaves ':done': the job is kept. Returns how many were deleted.
local limit = tonumber(ARGV[2])
local ids = redis.call('ZRANGEBYSCORE', DONE, '-inf', '(' .. ARGV[1], 'LIMIT', 0, limit)
local cap = tonumber(ARGV[3])
if cap > 0 and #ids < limit and tonumber(ARGV[4]) > tonumber(ARGV[1]) then
  local over = redis.call('ZCARD', DONE) - cap
  if over > #ids then
    ids = redis.call('ZRANGEBYSCORE', DONE, '-inf', '(' .. ARGV[4], 'LIMIT', 0, math.min(limit, over))
  end
end
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

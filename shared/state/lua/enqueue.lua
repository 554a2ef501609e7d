-- enqueue: KEYS[2] job hash. ARGV: job_id, spec, prio, submitted_at, reason, now, traceparent
local job, jkey = ARGV[1], KEYS[2]
local st = redis.call('HGET', jkey, 'state')
if st == 'pending' then
  redis.call('HSET', jkey, 'reason', ARGV[5])
  return 'pending'
end
if st then return st end
redis.call('HSET', jkey, 'spec', ARGV[2], 'prio', ARGV[3], 'at', ARGV[4], 'attempts', 0, 'tp', ARGV[7] or '')
redis.call('SADD', JOBS, job)
redis.call('ZADD', PENDING, prio_score(tonumber(ARGV[3]), tonumber(ARGV[4])), job)
set_state(job, '', 'pending', ARGV[5], tonumber(ARGV[6]))
return 'queued'

-- cancel: pending -> cancelled; unknown -> cancelled tombstone (a late submit is then a no-op); active -> flag
-- it and let the caller stop the workload (the exit then releases it). ARGV: job_id, reason, now
local job, jkey = ARGV[1], KEYS[2]
local now = tonumber(ARGV[3])
local f = redis.call('HMGET', jkey, 'state', 'node', 'gpu', 'inst')
local st = f[1]
if not st then
  redis.call('SADD', JOBS, job)
  set_state(job, '', 'cancelled', ARGV[2], now)
  return {'cancelled', '', '', ''}
end
if st == 'pending' then
  redis.call('ZREM', PENDING, job)
  set_state(job, st, 'cancelled', ARGV[2], now)
  return {'cancelled', '', '', ''}
end
if st == 'placing' or st == 'running' or st == 'migrating' then
  redis.call('HSET', jkey, 'cancel', 1)
  hist(job, st, st, 'cancel requested: ' .. ARGV[2], now)
  return {'stop', f[2] or '', f[3] or '', f[4] or ''}
end
return {'noop', st, '', ''}

-- fail_placement: the executor could not apply a placement. The reservation is released (a created instance is
-- removed, a reused one is idle again) and the job re-queued, or failed after max_attempts.
-- KEYS[2] job hash. ARGV: job_id, reason, now, max_attempts, cmd_id
local job, jkey = ARGV[1], KEYS[2]
local now = tonumber(ARGV[3])
if ARGV[5] ~= '' then redis.call('HDEL', CMDS, ARGV[5]) end
local f = redis.call('HMGET', jkey, 'state', 'gpu', 'inst', 'attempts', 'preempted')
if f[1] ~= 'placing' then return {'noop', f[1] or '', ''} end
local gkey = gk(f[2])
local insts = decode_insts(redis.call('HGET', gkey, 'inst'))
local n, i = find(insts, f[3])
if i and i.job == job then
  if i.created then table.remove(insts, n) else idle(i) end
end
save_gpu(gkey, insts, true)
-- preemptions count as attempts (each placement needs its own command id) but never fail a job
if tonumber(f[4] or '0') - tonumber(f[5] or '0') + 1 >= tonumber(ARGV[4]) then
  redis.call('HINCRBY', jkey, 'attempts', 1)
  set_state(job, 'placing', 'failed', ARGV[2], now)
  return {'ok', 'failed', f[2]}
end
requeue(job, 'placing', ARGV[2], now)
return {'ok', 'pending', f[2]}

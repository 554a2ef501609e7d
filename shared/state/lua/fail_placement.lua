-- fail_placement: the executor could not apply a placement. The reservation is released on every slot (a
-- created instance is removed, a reused one is idle again) and the job re-queued, or failed after max_attempts.
-- KEYS[2] job hash. ARGV: job_id, reason, now, max_attempts, cmd_id, attempt (of the place command; '' = unknown)
-- A command of an older attempt than the job's (applied or timed out after the job was re-queued) says nothing
-- about the job's current placement: a no-op.
local job, jkey = ARGV[1], KEYS[2]
local now = tonumber(ARGV[3])
if ARGV[5] ~= '' then redis.call('HDEL', CMDS, ARGV[5]) end
local f = redis.call('HMGET', jkey, 'state', 'gpu', 'inst', 'attempts', 'preempted', 'slots')
if f[1] ~= 'placing' then return {'noop', f[1] or '', ''} end
local attempt = tonumber(ARGV[6] or '')
if attempt and attempt < tonumber(f[4] or '0') then return {'noop', f[1], ''} end
local gpus = {}
for _, s in ipairs(job_slots(f[2], f[3], f[6])) do table.insert(gpus, s[1]) end
for _, e in ipairs(slot_insts(job, job_slots(f[2], f[3], f[6]))) do
  if e.i then vacate(e.insts, e.i.id, job, true) end
  save_gpu(e.key, e.insts, true)
end
gpus = table.concat(gpus, ',')  -- a gang frees several GPUs
-- preemptions count as attempts (each placement needs its own command id) but never fail a job
if tonumber(f[4] or '0') - tonumber(f[5] or '0') + 1 >= tonumber(ARGV[4]) then
  redis.call('HINCRBY', jkey, 'attempts', 1)
  set_state(job, 'placing', 'failed', ARGV[2], now)
  return {'ok', 'failed', gpus}
end
requeue(job, 'placing', ARGV[2], now)
return {'ok', 'pending', gpus}

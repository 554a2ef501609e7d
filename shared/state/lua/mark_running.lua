-- mark_running: the executor started the job on its reserved instance(s). No version bump: a reserved instance
-- already occupies its slices, so no decision changes. KEYS[2] job hash. ARGV: job_id, instance_id, now, cmd_id
local job, jkey = ARGV[1], KEYS[2]
local f = redis.call('HMGET', jkey, 'state', 'gpu', 'inst', 'slots')
if ARGV[4] ~= '' then redis.call('HDEL', CMDS, ARGV[4]) end
if f[1] ~= 'placing' then return {'noop', f[1] or ''} end
if ARGV[2] ~= '' and ARGV[2] ~= f[3] then return {'stale', f[1]} end
local held = slot_insts(job, job_slots(f[2], f[3], f[4]))
for _, e in ipairs(held) do if not e.i then return {'gone', f[1]} end end
for _, e in ipairs(held) do
  e.i.state = 'busy'; e.i.started = tonumber(ARGV[3]); e.i.created = nil
  save_gpu(e.key, e.insts, false)
end
set_state(job, 'placing', 'running', 'executor started the workload', tonumber(ARGV[3]))
return {'ok', 'running'}

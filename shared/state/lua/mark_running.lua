-- mark_running: the executor started the job on its reserved instance. No version bump: a reserved instance
-- already occupies its slices, so no decision changes. KEYS[2] job hash. ARGV: job_id, instance_id, now, cmd_id
local job, jkey = ARGV[1], KEYS[2]
local f = redis.call('HMGET', jkey, 'state', 'gpu', 'inst')
if ARGV[4] ~= '' then redis.call('HDEL', CMDS, ARGV[4]) end
if f[1] ~= 'placing' then return {'noop', f[1] or ''} end
if ARGV[2] ~= '' and ARGV[2] ~= f[3] then return {'stale', f[1]} end
local gkey = gk(f[2])
local insts = decode_insts(redis.call('HGET', gkey, 'inst'))
local _, i = find(insts, f[3])
if not i or i.job ~= job then return {'gone', f[1]} end
i.state = 'busy'; i.started = tonumber(ARGV[3]); i.created = nil
save_gpu(gkey, insts, false)
set_state(job, 'placing', 'running', 'executor started the workload', tonumber(ARGV[3]))
return {'ok', 'running'}

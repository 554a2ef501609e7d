-- reserve: KEYS[2] gpu hash, KEYS[3] job hash.
-- ARGV: reservation JSON (shared.state.model.Reservation without its spec), now, spec (the JobSubmit JSON)
local r = cjson.decode(ARGV[1])
local job, gkey, jkey = r.job_id, KEYS[2], KEYS[3]
local now = tonumber(ARGV[2])
local st = redis.call('HGET', jkey, 'state')
if st and st ~= 'pending' then return {'known', 0, st} end
local g = redis.call('HMGET', gkey, 'ver', 'healthy', 'node')
if not g[1] then return {'nogpu', 0, ''} end
if tonumber(g[1]) ~= r.expected_ver then return {'conflict', tonumber(g[1]), 'version ' .. g[1]} end
if g[2] ~= '1' then return {'unhealthy', tonumber(g[1]), ''} end
local insts = decode_insts(redis.call('HGET', gkey, 'inst'))
-- preemption in the same transition: every victim must still run on this GPU, on the instance the decision
-- saw; checked for all before anything is written, then each instance idles and its job is re-queued with its
-- reason and its original submit time (it keeps its age in the queue)
local victims = r.victims or {}
local gpu_id = string.sub(gkey, string.len(P) + 6)
for _, v in ipairs(victims) do
  local vf = redis.call('HMGET', jk(v.job_id), 'state', 'gpu', 'inst')
  if vf[1] ~= 'running' or vf[2] ~= gpu_id or vf[3] ~= v.instance_id then
    return {'victim', tonumber(g[1]), v.job_id .. ' is ' .. (vf[1] or 'unknown') .. ' on ' .. (vf[2] or '-')}
  end
  local _, vi = find(insts, v.instance_id)
  if not vi or vi.job ~= v.job_id or vi.pre == false then return {'victim', tonumber(g[1]), v.instance_id} end
end
for _, v in ipairs(victims) do
  local _, vi = find(insts, v.instance_id)
  idle(vi)  -- in memory only: written below, once every check has passed
end
local new = r.instance
if r.action == 'reuse' then
  local _, i = find(insts, new.id)
  if not i then return {'gone', tonumber(g[1]), new.id} end
  if i.state ~= 'idle' then return {'busy', tonumber(g[1]), new.id} end
  i.state = 'reserved'; i.job = job; i.prio = new.prio; i.ls = new.ls; i.mig = new.mig; i.tenant = new.tenant
  i.pre = new.pre; i.created = nil
else
  for _, id in ipairs(r.destroy) do
    local n, i = find(insts, id)
    if i then
      if i.state ~= 'idle' then return {'busy', tonumber(g[1]), id} end
      table.remove(insts, n)
    end
  end
  local m = imask(new)
  local same = 0
  for _, i in ipairs(insts) do
    if bit.band(imask(i), m) ~= 0 then return {'overlap', tonumber(g[1]), i.id} end
    if i.profile == new.profile then same = same + 1 end
  end
  if same >= r.max_count then return {'count', tonumber(g[1]), new.profile} end
  new.state = 'reserved'; new.job = job; new.created = true
  table.insert(insts, new)
end
for _, v in ipairs(victims) do
  local vk = jk(v.job_id)
  local f = redis.call('HMGET', vk, 'prio', 'at')
  redis.call('HDEL', vk, 'gpu', 'inst', 'node', 'mig_gpu', 'mig_inst')
  redis.call('HINCRBY', vk, 'preempted', 1)
  redis.call('HINCRBY', vk, 'attempts', 1)  -- its next placement gets new message and command ids
  redis.call('ZADD', PENDING, prio_score(tonumber(f[1] or '0'), tonumber(f[2] or '0')), v.job_id)
  set_state(v.job_id, 'running', 'pending', v.reason, now)
end
local ver = save_gpu(gkey, insts, 'claim')
if st == 'pending' then
  redis.call('ZREM', PENDING, job)
else
  redis.call('HSET', jkey, 'spec', ARGV[3], 'prio', r.prio, 'at', r.submitted_at, 'attempts', 0, 'tp', r.traceparent or '')
  redis.call('SADD', JOBS, job)
end
redis.call('HSET', jkey, 'gpu', string.sub(gkey, string.len(P) + 6), 'inst', new.id, 'node', g[3])
if r.tenant and r.tenant ~= '' then
  redis.call('HSET', jkey, 'tenant', r.tenant, 'usage', cjson.encode(r.usage or {}))
end
set_state(job, st or '', 'placing', r.reason, now)
return {'ok', ver, redis.call('HGET', jkey, 'attempts') or '0'}

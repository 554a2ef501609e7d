-- reserve: KEYS[2] first slot's gpu hash, KEYS[3] job hash.
-- ARGV: reservation JSON (shared.state.model.Reservation without its spec), now, spec (the JobSubmit JSON)
-- All or nothing: every slot (the reservation's own fields, then 'extra' for a gang) is checked against its
-- GPU's version and contents, and every victim against the job store, on in-memory copies; only then is
-- anything written.
local r = cjson.decode(ARGV[1])
local job, jkey = r.job_id, KEYS[3]
local now = tonumber(ARGV[2])
local jf = redis.call('HMGET', jkey, 'state', 'attempts')
local st = jf[1]
if st and st ~= 'pending' then return {'known', 0, st} end
local slots = {{gpu_id = r.gpu_id, expected_ver = r.expected_ver, instance = r.instance, action = r.action,
  destroy = r.destroy or {}, max_count = r.max_count}}
for _, s in ipairs(r.extra or {}) do table.insert(slots, s) end
-- the GPUs touched, read once: id -> {key, insts, ver, claim}; a slot's GPU is claimed (its version moves)
local gpus, order = {}, {}
local function load(id)
  local g = gpus[id]
  if not g then
    local key = gk(id)
    local h = redis.call('HMGET', key, 'ver', 'healthy', 'node', 'mig', 'replicas')
    if not h[1] then return nil end
    g = {key = key, ver = tonumber(h[1]), healthy = h[2] == '1', node = h[3], mig = h[4] ~= '0',
      replicas = tonumber(h[5] or '0'), insts = decode_insts(redis.call('HGET', key, 'inst'))}
    gpus[id] = g
    table.insert(order, id)
  end
  return g
end
local first
for _, s in ipairs(slots) do
  local g = load(s.gpu_id)
  if not g then return {'nogpu', 0, s.gpu_id} end
  first = first or g
  if g.ver ~= s.expected_ver then return {'conflict', first.ver, s.gpu_id .. ' version ' .. g.ver} end
  if not g.healthy then return {'unhealthy', first.ver, s.gpu_id} end
  if g.node ~= first.node and not r.span then return {'node', first.ver, s.gpu_id .. ' is on another node'} end
  g.claim = true
end
-- preemption in the same transition: every victim must still run on the instance the decision saw; all its
-- instances are vacated (in memory), then its job is re-queued with its reason and original submit time
local victims = r.victims or {}
for _, v in ipairs(victims) do
  local vf = redis.call('HMGET', jk(v.job_id), 'state', 'gpu', 'inst', 'slots')
  if vf[1] ~= 'running' or not names(v.job_id, v.instance_id) then
    return {'victim', first.ver, v.job_id .. ' is ' .. (vf[1] or 'unknown') .. ' on ' .. (vf[2] or '-')}
  end
  for _, s in ipairs(job_slots(vf[2], vf[3], vf[4])) do
    local g = load(s[1])
    local _, vi = find(g and g.insts or {}, s[2])
    if not vi or vi.job ~= v.job_id or vi.pre == false then return {'victim', first.ver, s[2]} end
    vacate(g.insts, s[2], v.job_id, false)
  end
end
local new_ids = {}
for _, s in ipairs(slots) do
  local g, new = gpus[s.gpu_id], s.instance
  local ver = first.ver
  if is_plain(new) then
    if g.mig then return {'mode', ver, s.gpu_id .. ' is in MIG mode'} end
    local shares = 0
    for _, i in ipairs(g.insts) do
      if new.profile == 'gpu' or i.profile == 'gpu' then return {'busy', ver, i.id} end
      if i.start == new.start then return {'overlap', ver, i.id} end
      shares = shares + 1
    end
    if new.profile == 'shared' and (new.start >= g.replicas or shares >= g.replicas) then
      return {'count', ver, s.gpu_id .. ' has ' .. g.replicas .. ' replicas'}
    end
    new.state = 'reserved'; new.job = job; new.created = true
    table.insert(g.insts, new)
  elseif not g.mig then
    return {'mode', ver, s.gpu_id .. ' is not in MIG mode'}
  elseif s.action == 'reuse' then
    local _, i = find(g.insts, new.id)
    if not i then return {'gone', ver, new.id} end
    if i.state ~= 'idle' then return {'busy', ver, new.id} end
    i.state = 'reserved'; i.job = job; i.prio = new.prio; i.ls = new.ls; i.mig = new.mig; i.tenant = new.tenant
    i.pre = new.pre; i.created = nil; i.ends = new.ends
  else
    for _, id in ipairs(s.destroy or {}) do
      local n, i = find(g.insts, id)
      if i then
        if i.state ~= 'idle' then return {'busy', ver, id} end
        table.remove(g.insts, n)
      end
    end
    local m = imask(new)
    local same = 0
    for _, i in ipairs(g.insts) do
      if bit.band(imask(i), m) ~= 0 then return {'overlap', ver, i.id} end
      if i.profile == new.profile then same = same + 1 end
    end
    if same >= s.max_count then return {'count', ver, new.profile} end
    new.state = 'reserved'; new.job = job; new.created = true
    table.insert(g.insts, new)
  end
  table.insert(new_ids, {s.gpu_id, new.id})
end
-- the tenant's quota against this shard's usage counters, the victims' charges given back first
local tenant = r.tenant ~= cjson.null and r.tenant or ''
local usage = (r.usage ~= nil and r.usage ~= cjson.null) and r.usage or {}
if tenant ~= '' and r.limits and r.limits ~= cjson.null and #r.limits > 0 then
  local freed = {}
  for _, v in ipairs(victims) do
    local f = redis.call('HMGET', jk(v.job_id), 'charged', 'tenant', 'usage')
    if f[1] then
      for resource, amount in pairs(cjson.decode(f[3] or '{}')) do
        local k = usage_field(f[2], resource)
        freed[k] = (freed[k] or 0) + amount
      end
    end
  end
  local function used(t, resource)
    local k = usage_field(t, resource)
    return tonumber(redis.call('HGET', USAGE, k) or '0') - (freed[k] or 0)
  end
  for _, l in ipairs(r.limits) do
    local q = tonumber(usage[l.resource] or 0)
    if q > 0 then
      local new = used(tenant, l.resource) + q
      if l.cap ~= nil and l.cap ~= cjson.null and new > l.cap + 1e-9 then
        return {'quota', first.ver, tenant .. ' would use ' .. new .. ' ' .. l.resource .. ' in this shard; it may ' ..
          l.cap}
      end
      local members = (l.members ~= nil and l.members ~= cjson.null) and l.members or {}
      if #members > 0 and new > (l.nominal or 0) + 1e-9 then
        local fields = {}
        for n, m in ipairs(members) do fields[n] = usage_field(m, l.resource) end
        local c = q
        for n, v in ipairs(redis.call('HMGET', USAGE, unpack(fields))) do
          c = c + tonumber(v or '0') - (freed[fields[n]] or 0)
        end
        if c > (l.cohort_cap or 0) + 1e-9 then
          return {'quota', first.ver, 'its cohort would use ' .. c .. ' ' .. l.resource .. ' in this shard; it may ' ..
            l.cohort_cap}
        end
      end
    end
  end
end
for _, v in ipairs(victims) do
  local vk = jk(v.job_id)
  local f = redis.call('HMGET', vk, 'prio', 'at')
  redis.call('HDEL', vk, 'gpu', 'inst', 'node', 'mig_gpu', 'mig_inst', 'mig_gone', 'slots')
  redis.call('HINCRBY', vk, 'preempted', 1)
  redis.call('HINCRBY', vk, 'attempts', 1)  -- its next placement gets new message and command ids
  redis.call('ZADD', PENDING, prio_score(tonumber(f[1] or '0'), tonumber(f[2] or '0')), v.job_id)
  set_state(v.job_id, 'running', 'pending', v.reason, now)
end
local ver = 0
for n, id in ipairs(order) do
  local g = gpus[id]
  local v = save_gpu(g.key, g.insts, g.claim and 'claim' or true)
  if n == 1 then ver = v end
end
-- the job's fields in one write (each call costs the script ~1-2 us, and the AOF a copy of the key)
local fields = {'gpu', r.gpu_id, 'inst', new_ids[1][2], 'node', first.node}
local function add(...) for _, x in ipairs({...}) do table.insert(fields, x) end end
local attempts = jf[2] or '0'
if st == 'pending' then
  redis.call('ZREM', PENDING, job)
else
  add('spec', ARGV[3], 'prio', r.prio, 'at', r.submitted_at, 'attempts', 0, 'tp', r.traceparent or '')
  redis.call('SADD', JOBS, job)
  attempts = '0'
end
if #new_ids > 1 then add('slots', cjson.encode(new_ids)) end
if tenant ~= '' then
  add('tenant', tenant, 'usage', cjson.encode(usage), 'charged', '1')
  for resource, amount in pairs(usage) do redis.call('HINCRBYFLOAT', USAGE, usage_field(tenant, resource), amount) end
else  -- no tenant's charge left from an earlier placement (recount_usage.lua reads these)
  add('tenant', '', 'usage', '{}')
end
redis.call('HSET', jkey, unpack(fields))
set_state(job, st or '', 'placing', r.reason, now)
if r.track and r.span then
  -- a gang across nodes: one place command per member node, 'place:<job>:<attempt>/<node rank>', each tracked
  local k, seen = -1, {}
  for _, s in ipairs(slots) do
    local n = gpus[s.gpu_id].node
    if not seen[n] then
      k = k + 1
      seen[n] = true
      redis.call('HSET', CMDS, 'place:' .. job .. ':' .. attempts .. '/' .. k,
        cjson.encode({node = n, kind = 'place', job = job, gpu = s.gpu_id, at = now}))
    end
  end
elseif r.track then  -- the balancer sends the place command itself: track it for the command time-out sweep
  redis.call('HSET', CMDS, 'place:' .. job .. ':' .. attempts,
    cjson.encode({node = first.node, kind = 'place', job = job, gpu = r.gpu_id, at = now}))
end
-- a gang: its first member's address (that executor's declared MIGSCHED_NODE_ADDR), the rendezvous host
if #slots > 1 then return {'ok', ver, attempts, redis.call('HGET', nk(first.node), 'addr') or ''} end
return {'ok', ver, attempts}

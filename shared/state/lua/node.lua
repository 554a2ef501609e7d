-- node: registration and loss of one node. KEYS[2] node hash.
--   register ARGV: 'register', node, now, gpus_json, registration id ('' = none), address ('' = none), labels
--     (JSON object)
--     A registration already applied (the same id, redelivered after a handler fault) changes nothing: replayed
--     late, its stale instance list would drop instances created since and re-queue their jobs.
--     gpus_json: [{id, index, model, mig, healthy, uuid, replicas, instances: [{id, profile, start, size,
--     compute, job?}], jobs: [job ids running on a non-MIG GPU]}]
--     A new GPU adopts the reported instances as idle. A known GPU keeps the state's view of instances the node
--     still reports (a plain one, on a non-MIG GPU, while the node reports its job in 'jobs'); a busy instance
--     it no longer reports is drift: its job is re-queued (a gang once, with all its slots freed); an
--     unreported placing reservation is kept (its command may still be on its way).
--     A reported instance the state does not know, where a one-GPU reservation is, is adopted and the
--     reservation's job re-queued: the node would refuse its command for the overlap.
--     A reported instance running a job the state does not hold there is never adopted idle: it is kept
--     'retiring' with that job (occupied, never reused) and listed in 'stops' {job, gpu, instance} for the
--     registry to stop; 'stopped' idles it once the job is gone. A stop on another node (a gang across nodes
--     re-queued from this one) names that node fourth.
--   lost ARGV: 'lost', node, now, reason
--     Every GPU of the node becomes unhealthy and empty; every job on it is re-queued. A gang across nodes keeps
--     its parts on the other nodes taken, and a job moving to or from another node its copy there: 'stops'
--     {job, gpu, instance, node} lists one per node to stop (so does a registration that re-queues them).
--   stopped ARGV: 'stopped', node, now, job
--     The node stopped (or saw end) a job it ran unbeknown to the state (found by a registration, or started by
--     a place command applied late, mark_running.lua): the instances kept 'retiring' for it become idle. Returns {gpus = the GPUs changed}.
local op, node, nkey = ARGV[1], ARGV[2], KEYS[2]
local now = tonumber(ARGV[3])
local requeued, drift = {}, {}
local moves, reported_ids, gangs, stops = {}, {}, {}, {}
-- The node runs job on instance i although the state does not hold it there (an executor re-attached to its
-- workloads after a restart; a job re-queued since): adopted idle, the balancer would place other jobs on it
-- and the node would refuse them until they failed. Keep its slices taken until the job is stopped.
local function stop_foreign(i, job, gid)
  hold_for_stop(i, job)
  table.insert(stops, {job, gid, i.id})
end
local function evict(insts, keep, reason)
  -- re-queue the jobs of instances not kept; returns the kept instances
  local out = {}
  for _, i in ipairs(insts) do
    if keep(i) then
      table.insert(out, i)
    elseif i.job and i.state ~= 'idle' then
      local st = redis.call('HGET', jk(i.job), 'state')
      if st == 'placing' or st == 'running' or st == 'migrating' then
        if names(i.job, i.id) then
          local sl = redis.call('HGET', jk(i.job), 'slots')
          if sl then table.insert(gangs, {i.job, job_slots(nil, nil, sl)}) end
          if st == 'migrating' then
            local f = redis.call('HMGET', jk(i.job), 'gpu', 'inst', 'mig_gpu', 'mig_inst')
            table.insert(moves, {i.job, f[1], f[2], f[3], f[4]})
          end
          requeue(i.job, st, reason, now)
          table.insert(requeued, i.job)
        end
      end
    end
  end
  return out
end
-- A re-queued job that was moving leaves its other copy's instance behind (the target of its move, or the
-- source when the target went), held by a job that no longer names it. On the node that registers, an instance
-- it did not report does not exist: it is removed; one it reported idles. On another node the job's copy may
-- run still (the target once its node applied the move, the source until its migrate_stop): the instance stays
-- taken, 'retiring' with the job, and 'stops' names it with that node for the registry to stop that run.
local function free_moves()
  for _, m in ipairs(moves) do
    for _, pair in ipairs({{m[2], m[3]}, {m[4], m[5]}}) do
      local g, iid = pair[1], pair[2]
      if g and iid and redis.call('EXISTS', gk(g)) == 1 then
        local insts = decode_insts(redis.call('HGET', gk(g), 'inst'))
        local n, i = find(insts, iid)
        if i and i.job == m[1] and i.state ~= 'idle' then
          local there = redis.call('HGET', gk(g), 'node')
          if there ~= node then
            hold_for_stop(i, m[1])
            table.insert(stops, {m[1], g, iid, there})
            save_gpu(gk(g), insts, 'claim')
          else
            if op == 'register' and not reported_ids[iid] then table.remove(insts, n) else idle(i) end
            save_gpu(gk(g), insts, true)
          end
        end
      end
    end
  end
end
-- A re-queued gang leaves its instances on its other GPUs behind: free them (plain ones are removed). A gang
-- across nodes runs its other parts on their own nodes: those stay taken until each node confirms a 'stop'
-- (listed in 'stops' with their node).
local function free_gangs()
  for _, gang in ipairs(gangs) do
    if spans(gang[2]) then
      for _, s in ipairs(hold_members(gang[1], gang[2], node)) do
        table.insert(stops, {gang[1], s[2], s[3], s[1]})
      end
    end
    for _, e in ipairs(slot_insts(gang[1], gang[2])) do
      if e.i and e.i.state ~= 'idle' and e.i.state ~= 'retiring' then
        vacate(e.insts, e.i.id, gang[1], false)
        save_gpu(e.key, e.insts, true)
      end
    end
  end
end
if op == 'register' then
  local reg_id = ARGV[5] or ''
  if reg_id ~= '' and redis.call('HGET', nkey, 'reg_id') == reg_id then
    return cjson.encode({requeued = {}, drift = {}, gpus = cjson.decode(redis.call('HGET', nkey, 'gpus') or '[]'),
      replay = true})
  end
  local ids = {}
  for _, g in ipairs(cjson.decode(ARGV[4])) do
    table.insert(ids, g.id)
    local key = gk(g.id)
    local reported = g.instances or {}
    if redis.call('EXISTS', key) == 0 then
      local pos = redis.call('ZCARD', KEYS[1])
      redis.call('ZADD', KEYS[1], pos, g.id)
      redis.call('HSET', key, 'node', node, 'index', g.index, 'model', g.model, 'pos', pos, 'ver', 0, 'rev', 0,
        'uuid', g.uuid or '')
      for _, r in ipairs(reported) do
        local job = r.job
        r.state = 'idle'; r.job = nil
        if job then stop_foreign(r, job, g.id) end
      end
      redis.call('HSET', key, 'mig', g.mig and 1 or 0, 'healthy', g.healthy and 1 or 0, 'replicas', g.replicas or 0)
      save_gpu(key, reported, 'claim')
    else
      local byid, running, rjob = {}, {}, {}
      for _, r in ipairs(reported) do byid[r.id] = r; reported_ids[r.id] = true; rjob[r.id] = r.job end
      for _, j in ipairs(g.jobs or {}) do running[j] = true end
      local insts = decode_insts(redis.call('HGET', key, 'inst'))
      local kept = evict(insts, function(i)
        if byid[i.id] then byid[i.id] = nil; return true end
        if is_plain(i) and i.job and running[i.job] then return true end
        if i.state == 'reserved' or i.state == 'target' then return true end
        if i.state ~= 'idle' then table.insert(drift, g.id .. ': ' .. i.id .. ' (' .. i.state .. ') not reported') end
        return false
      end, 'node ' .. node .. ' re-registered without the instance')
      for _, i in ipairs(kept) do
        local job = rjob[i.id]
        local held = i.job == job and i.state ~= 'idle' and i.state ~= 'retiring'
        if job and not held then
          -- free or retiring in the state: hold it for the job; held for another job: only stop this one
          if i.state == 'idle' or i.state == 'retiring' then stop_foreign(i, job, g.id)
          else table.insert(stops, {job, g.id, i.id}) end
        end
      end
      for _, r in ipairs(reported) do
        if byid[r.id] then
          local job = r.job
          r.state = 'idle'; r.job = nil
          -- a one-GPU reservation in its way cannot be made on this node (its command is refused for overlap):
          -- re-queue its job and adopt what the node has, or the same slot is chosen again until the job fails
          kept = evict(kept, function(i)
            return bit.band(imask(i), imask(r)) == 0 or i.state ~= 'reserved' or not i.job
              or redis.call('HGET', jk(i.job), 'slots')
          end, 'node ' .. node .. ' holds ' .. r.id .. ' where the reservation is')
          local clash = false
          for _, i in ipairs(kept) do if bit.band(imask(i), imask(r)) ~= 0 then clash = true end end
          if clash then
            table.insert(drift, g.id .. ': reported ' .. r.id .. ' overlaps the state')
            if job then table.insert(stops, {job, g.id, r.id}) end
          else
            if job then stop_foreign(r, job, g.id) end
            table.insert(kept, r)
          end
        end
      end
      redis.call('HSET', key, 'mig', g.mig and 1 or 0, 'healthy', g.healthy and 1 or 0, 'model', g.model,
        'uuid', g.uuid or '', 'replicas', g.replicas or 0)
      save_gpu(key, kept, 'claim')
    end
  end
  free_moves()
  free_gangs()
  redis.call('SADD', NODES, node)
  redis.call('HSET', nkey, 'state', 'up', 'last_seen', now, 'registered_at', now, 'gpus', cjson.encode(ids),
    'reg_id', reg_id, 'addr', ARGV[6] or '', 'labels', ARGV[7] or '{}')
  return cjson.encode({requeued = requeued, drift = drift, gpus = ids, stops = stops})
end
if op == 'stopped' then
  local job, freed = ARGV[4], {}
  for _, id in ipairs(cjson.decode(redis.call('HGET', nkey, 'gpus') or '[]')) do
    local key = gk(id)
    local insts = decode_insts(redis.call('HGET', key, 'inst'))
    local hit = false
    for n = #insts, 1, -1 do
      local i = insts[n]
      if i.state == 'retiring' and i.job == job then
        if is_plain(i) then table.remove(insts, n) else idle(i) end  -- a plain instance leaves with its job
        hit = true
      end
    end
    if hit then save_gpu(key, insts, true); table.insert(freed, id) end
  end
  return cjson.encode({gpus = freed})
end
-- lost
if redis.call('HGET', nkey, 'state') ~= 'up' then return cjson.encode({requeued = {}, drift = {}, gpus = {}}) end
local ids = cjson.decode(redis.call('HGET', nkey, 'gpus') or '[]')
for _, id in ipairs(ids) do
  local key = gk(id)
  local insts = decode_insts(redis.call('HGET', key, 'inst'))
  evict(insts, function(i) return false end, ARGV[4])
  redis.call('HSET', key, 'healthy', 0)
  save_gpu(key, {}, 'claim')
end
free_moves()
free_gangs()
redis.call('HSET', nkey, 'state', 'lost', 'lost_at', now)
return cjson.encode({requeued = requeued, drift = drift, gpus = ids, stops = stops})

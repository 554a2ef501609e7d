-- Shared by every transition (prepended by shared/state/scripts.py). KEYS[1] is always the shard's GPU index
-- "{ns:shard}:gpus"; every other key of the shard is derived from it and carries the same hash tag, so the
-- script touches one Redis Cluster slot.
local P = string.sub(KEYS[1], 1, -6)
local PENDING = P .. ':pending'
local OCC = P .. ':occ'
local CMDS = P .. ':cmds'
local NODES = P .. ':nodes'
local JOBS = P .. ':jobs'
local PLACING = P .. ':placing'
local DONE = P .. ':done'
local USAGE = P .. ':usage'
local TERMINAL = {finished = true, failed = true, cancelled = true, rejected = true}
local ACTIVE = {placing = true, running = true, migrating = true}
local function gk(g) return P .. ':gpu:' .. g end
local function jk(j) return P .. ':job:' .. j end
local function hk(j) return P .. ':hist:' .. j end
local function nk(n) return P .. ':node:' .. n end

local function decode_insts(raw)
  if not raw or raw == '' or raw == '{}' or raw == '[]' then return {} end
  return cjson.decode(raw)
end
local function encode_insts(t)
  if #t == 0 then return '[]' end
  return cjson.encode(t)
end
local function imask(i) return bit.lshift(bit.lshift(1, i.size) - 1, i.start) end
local function busy_mask(insts)
  local m = 0
  for _, i in ipairs(insts) do if i.state ~= 'idle' then m = bit.bor(m, imask(i)) end end
  return m
end
-- Write the instances back and refresh the shard's occupancy byte. Two counters: 'rev' moves on every change;
-- 'ver', the one reservations compare-and-set on, moves only when capacity is claimed ('claim': a reservation,
-- a migration target, a retiring instance, a registration, a lost node). A change that only frees slices (release,
-- failed placement, destroyed instance, committed move) cannot make a reservation decided before it unsafe: the
-- scripts still check every overlap, count and idle instance themselves. Returns 'ver'.
local function save_gpu(key, insts, bump)
  local v = redis.call('HMGET', key, 'rev', 'ver', 'pos')
  local rev, ver = tonumber(v[1] or '0'), tonumber(v[2] or '0')
  if bump then rev = rev + 1 end
  if bump == 'claim' then ver = ver + 1 end
  redis.call('HSET', key, 'inst', encode_insts(insts), 'rev', rev, 'ver', ver)
  redis.call('SETRANGE', OCC, tonumber(v[3]), string.char(busy_mask(insts)))
  return ver
end
local function find(insts, id)
  for n, i in ipairs(insts) do if i.id == id then return n, i end end
  return nil, nil
end
-- A job's history lives in the job's hash: field 'h<n>' is its n-th entry ('hn' counts them), the last 64 kept
-- (shared.state.model.HISTORY_MAX). A list key per job ('hist', older versions, still read and deleted) doubled
-- the keys an ended job leaves in Redis: as fields it takes 5-11 % less memory, and an AOF rewrite 27-34 % less of
-- the child's CPU (load/bench_rewrite.py).
-- Returns the fields to write (set_state writes them with the state): the count is read and written back in
-- that one HSET, not incremented by a write of its own (an HINCRBY in the AOF, ~60 bytes a transition).
local function hist_entry(job, from, to, reason, now)
  local n = tonumber(redis.call('HGET', jk(job), 'hn') or '0') + 1
  if n > 64 then redis.call('HDEL', jk(job), 'h' .. (n - 64)) end
  return 'hn', n, 'h' .. n, cjson.encode({at = now, ['from'] = from, to = to, reason = reason})
end
local function hist(job, from, to, reason, now)
  redis.call('HSET', jk(job), hist_entry(job, from, to, reason, now))
end
-- Tenants' usage in this shard (':usage', field "<tenant>\t<resource>"): a job's charge is added when its
-- reservation commits ('charged' set in its hash) and taken off, once, when it leaves the active states, so
-- that reserve.lua can hold a placement to its tenant's quota in the same step.
local function usage_field(tenant, resource) return tenant .. '\t' .. resource end
local function uncharge(job)
  local f = redis.call('HMGET', jk(job), 'charged', 'tenant', 'usage')
  if not f[1] then return end
  redis.call('HDEL', jk(job), 'charged')
  for resource, amount in pairs(cjson.decode(f[3] or '{}')) do
    local field = usage_field(f[2], resource)
    if tonumber(redis.call('HINCRBYFLOAT', USAGE, field, -amount)) <= 1e-9 then redis.call('HDEL', USAGE, field) end
  end
end
local function set_state(job, from, to, reason, now)
  if ACTIVE[from] and not ACTIVE[to] then uncharge(job) end
  local c, n, f, v = hist_entry(job, from, to, reason, now)
  redis.call('HSET', jk(job), 'state', to, 'reason', reason, 'updated', now, c, n, f, v)
  -- jobs in placing, by when: a placement whose command never went out is found and re-queued
  if to == 'placing' then redis.call('ZADD', PLACING, now, job)
  elseif from == 'placing' then redis.call('ZREM', PLACING, job) end
  -- ended jobs, by when: expire.lua deletes them after the retention. Any other state takes the job out when
  -- it may be there: 'from' is always the state the script found, so only a job leaving a terminal state (no
  -- script does today, but settle.lua takes any from-state) or one without a record (a job id whose record
  -- was deleted by hand and then submitted again must not be deleted under it) can be listed.
  if TERMINAL[to] then redis.call('ZADD', DONE, now, job)
  elseif from == '' or TERMINAL[from] then redis.call('ZREM', DONE, job) end
end
local function prio_score(prio, at) return (1000 - prio) * 1e10 + at end
local function requeue(job, from, reason, now)
  local f = redis.call('HMGET', jk(job), 'prio', 'at')
  redis.call('HINCRBY', jk(job), 'attempts', 1)
  redis.call('HDEL', jk(job), 'gpu', 'inst', 'node', 'mig_gpu', 'mig_inst', 'mig_gone', 'slots')
  redis.call('ZADD', PENDING, prio_score(tonumber(f[1] or '0'), tonumber(f[2] or '0')), job)
  set_state(job, from, 'pending', reason, now)
end
local function idle(i)
  i.state = 'idle'; i.job = nil; i.prio = nil; i.ls = nil; i.mig = nil; i.tenant = nil; i.started = nil
  i.created = nil; i.pre = nil; i.ends = nil
end
-- A job runs on instance i although the state does not hold it there (a registration found it, node.lua; a place
-- command the state had given up on started it, mark_running.lua): its slices stay taken, never reused or moved,
-- until the node confirms the job is gone there (node.lua 'stopped' makes it idle).
local function hold_for_stop(i, job)
  idle(i); i.state = 'retiring'; i.job = job
end
-- The idle instances a move's reserve removed from its target's way (the job's 'mig_gone', raw), back in insts as
-- state ('idle': untouched; 'retiring': a destroy_idle settles them) unless one overlaps an instance there now
-- (migrate.lua abort, release.lua). Returns their ids.
local function give_back(insts, raw, state)
  local back = {}
  for _, g in ipairs(decode_insts(raw)) do
    local m, clear = imask(g), true
    for _, i in ipairs(insts) do
      if i.id == g.id or bit.band(imask(i), m) ~= 0 then clear = false end
    end
    if clear then
      idle(g)
      g.state = state
      table.insert(insts, g)
      table.insert(back, g.id)
    end
  end
  return back
end
-- Non-MIG GPUs hold plain instances: 'gpu' (the whole GPU, its busy mask full) or 'shared' (one time-slice
-- replica, start = replica index, size 0). They are never idle: a job leaving one removes it.
local function is_plain(i) return i.profile == 'gpu' or i.profile == 'shared' end
-- A job's slots {{gpu, inst}, ...}: a gang lists them all in its 'slots' field, a single-slot job only has
-- 'gpu'/'inst'.
local function job_slots(gpu, inst, raw)
  if raw and raw ~= '' and raw ~= '[]' and raw ~= '{}' then return cjson.decode(raw) end
  if gpu and inst and gpu ~= '' then return {{gpu, inst}} end
  return {}
end
-- The node of a GPU id ('<node>/<index>') and of an instance id ('<gpu id>:...').
local function node_of(gid) return string.match(gid or '', '^(.*)/[^/]*$') end
local function inst_node(iid) return node_of(string.match(iid or '', '^([^:]+):')) end
-- Whether a job's placement holds anything on a node: its slots, its node, its move target.
local function holds_on(slots, jnode, mig_gpu, node)
  if jnode == node or (mig_gpu and node_of(mig_gpu) == node) then return true end
  for _, s in ipairs(slots) do if node_of(s[1]) == node then return true end end
  return false
end
-- Whether a job's slots span several nodes (a gang across nodes: each member node runs its part and reports
-- its start and its exit on its own).
local function spans(slots)
  for _, s in ipairs(slots) do if node_of(s[1]) ~= node_of(slots[1][1]) then return true end end
  return false
end
-- Every slot of a job read once: {key, insts, i} with i nil when the GPU no longer holds the job there. The
-- caller changes the tables and saves them, so a transition checks every slot before it writes any.
local function slot_insts(job, slots)
  local out = {}
  for _, s in ipairs(slots) do
    local key = gk(s[1])
    local insts = decode_insts(redis.call('HGET', key, 'inst'))
    local _, i = find(insts, s[2])
    if i and i.job ~= job then i = nil end
    table.insert(out, {key = key, gid = s[1], insts = insts, i = i})
  end
  return out
end
-- The job leaves instance id: a MIG instance idles (kept for reuse; removed instead when 'drop_created' and
-- its own reservation created it), a plain one is removed. Returns the instance (nil if it was not the job's).
local function vacate(insts, id, job, drop_created)
  local n, i = find(insts, id)
  if not i or i.job ~= job then return nil end
  if is_plain(i) or (drop_created and i.created) then table.remove(insts, n) else idle(i) end
  return i
end
-- A gang across nodes that must end: its instances still held on nodes other than 'but' stay taken (retiring
-- with the job) until each node confirms the stop (node.lua 'stopped'). Saves the GPUs it changed; returns
-- one {node, gpu, instance} per node to send a 'stop' to.
local function hold_members(job, slots, but)
  local stops, seen = {}, {}
  for _, e in ipairs(slot_insts(job, slots)) do
    if e.i then
      local n = node_of(e.gid)
      if n ~= but then
        hold_for_stop(e.i, job)
        save_gpu(e.key, e.insts, 'claim')
        if not seen[n] then
          seen[n] = true
          table.insert(stops, {n, e.gid, e.i.id})
        end
      end
    end
  end
  return stops
end
-- Whether the job's record names instance iid: one of its slots or its migration target (instance ids carry
-- their GPU id, so the id alone is unique).
local function names(job, iid)
  local f = redis.call('HMGET', jk(job), 'inst', 'mig_inst', 'slots')
  if f[1] == iid or f[2] == iid then return true end
  for _, s in ipairs(job_slots(nil, nil, f[3])) do if s[2] == iid then return true end end
  return false
end
-- A job routed away from this shard, its home (lua/route.lua), lives in another: a transition of it sent here
-- (by a process that has not learnt the route yet) changes nothing and answers where it lives, and the caller
-- sends it there (shared/state/batch.py). KEYS[2] or KEYS[3] is the job's key in the job transitions.
do
  local pre = P .. ':job:'
  for n = 2, #KEYS do
    if string.sub(KEYS[n], 1, #pre) == pre then
      local routed = redis.call('HGET', P .. ':routes', string.sub(KEYS[n], #pre + 1))
      if routed then return {'routed', routed} end
    end
  end
end

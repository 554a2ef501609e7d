-- release: a job left its instances (every slot of a gang). Idempotent: the first call frees them, later ones
-- are no-ops. KEYS[2] job hash. ARGV: job_id, exit_kind, new_state, reason, now, instance_id ('' = any), node
-- ('' = any: the reporting node; an exit naming no instance from a node where the job holds nothing is stale),
-- attempt (of the place command that started the run; '' = unknown): older than that of the placement's run, the
-- run's placement is gone and the exit is stale, even when it names the instance a later placement reuses;
-- report (the exit report's id, '' = unknown).
-- Returns {status, state, gpu, node, profile, insts, ver, model, index, slots[, stop node, stop gpu, stop
-- instance, given back[, member stops]]} (see ReleaseResult); {'member', state, gpu, node, '', freed slots}
-- when one member of a gang across nodes completed and others still run.
local job, jkey = ARGV[1], KEYS[2]
local now = tonumber(ARGV[5])
local f = redis.call('HMGET', jkey, 'state', 'gpu', 'inst', 'mig_gpu', 'mig_inst', 'node', 'slots', 'attempts', 'ra',
  'xid')
local report = ARGV[9] or ''
local st = f[1]
if st ~= 'placing' and st ~= 'running' and st ~= 'migrating' then
  -- already released: still hand back the GPU as it is now when the exit names the job's last instance and is
  -- the report that released it (ARGV[9], kept as 'xid'), redelivered: its job exit is to go out again. Another
  -- report naming that instance (another copy of the job) gets none
  if f[2] and ARGV[6] ~= '' and ARGV[6] == f[3] and (not f[10] or report == '' or report == f[10]) then
    local gm = redis.call('HMGET', gk(f[2]), 'inst', 'model', 'index', 'ver')
    if gm[2] then
      return {'noop', st or '', f[2], f[6] or '', '', gm[1], tonumber(gm[4]), gm[2], gm[3], f[7] or ''}
    end
  end
  return {'noop', st or '', '', '', '', ''}
end
-- the attempt whose run the placement is: the job's, or an earlier one's late run it took (mark_running.lua 'ra')
local current = tonumber(f[8] or '0')
local ra_of, ra = string.match(f[9] or '', '^(%d+):(%d+)$')
if ra_of and tonumber(ra_of) == current then current = tonumber(ra) end
local attempt = tonumber(ARGV[8] or '')
if attempt and attempt < current then
  return {'stale', st, f[2], f[6] or '', '', ''}
end
local slots = job_slots(f[2], f[3], f[7])
local across = ARGV[6] ~= '' and spans(slots)
if ARGV[6] ~= '' and ARGV[6] ~= f[3] and ARGV[6] ~= f[5] and not (across and names(job, ARGV[6])) then
  return {'stale', st, f[2], f[6] or '', '', ''}
end
if ARGV[6] == '' and (ARGV[7] or '') ~= '' and not holds_on(slots, f[6], f[4], ARGV[7]) then
  return {'stale', st, f[2], f[6] or '', '', ''}
end
-- A gang across nodes: each member node reports the exit of its own part (naming one of its instances). A
-- member that completed frees its slots, and the job runs on until the last member ends ('member': nothing
-- else changes). Any other end (a failure, a stop, a lost or preempted member) ends the job: the slots still
-- held on the other nodes stay taken until each node confirms the 'stop' the registry sends it.
local stops, freed_raw = {}, nil
if across then
  local node = inst_node(ARGV[6])
  local mine, others = {}, false
  for _, e in ipairs(slot_insts(job, slots)) do
    if e.i and node_of(e.gid) == node then table.insert(mine, e)
    elseif e.i then others = true end
  end
  if #mine == 0 then return {'noop', st, '', '', '', ''} end  -- this member's exit was applied already
  local freed = {}
  for _, e in ipairs(mine) do
    vacate(e.insts, e.i.id, job, false)
    save_gpu(e.key, e.insts, true)
    table.insert(freed, {e.gid, e.i.id})
  end
  if others and ARGV[3] == 'finished' then
    hist(job, st, st, 'node ' .. node .. ' completed its part of the gang', now)
    return {'member', st, freed[1][1], node, '', cjson.encode(freed)}
  end
  if others then stops = hold_members(job, slots, node) end
  freed_raw = cjson.encode(freed)
end
local profile, ver = '', 0
for n, e in ipairs(slot_insts(job, slots)) do
  local i = e.i and e.i.state ~= 'retiring' and vacate(e.insts, e.i.id, job, false)
  if n == 1 and i then profile = i.profile end
  local v = save_gpu(e.key, e.insts, true)
  if n == 1 then ver = v end
end
local stop, given = nil, ''
if st == 'migrating' and f[4] then
  -- the move's target. An exit from the source copy means the move never took. On the source's node the
  -- executor destroys a target it created when the move fails (and creates none for a job that already ended),
  -- so the state drops it too; idling it left an instance the GPU did not have, which placements reused and
  -- failed on until the job ran out of attempts. On another node the target's node created it and may run the
  -- job's copy there (nobody stops it otherwise): the target stays 'retiring' with the job, its slices taken,
  -- and the registry sends that node a 'stop' of that run ('stop' below); the node's confirmation (node.lua
  -- 'stopped') idles it, a failed migrate_start (migrate.lua 'abort') drops it. An exit from the target copy
  -- (the move took, not yet committed), or one naming no instance, leaves the target idle: it exists.
  local mkey = gk(f[4])
  local minsts = decode_insts(redis.call('HGET', mkey, 'inst'))
  local tn, t = find(minsts, f[5])
  if t and t.job == job then
    if t.created and ARGV[6] ~= '' and ARGV[6] ~= f[5] then
      local tnode = redis.call('HGET', mkey, 'node') or ''
      if tnode ~= '' and tnode ~= (f[6] or '') then
        hold_for_stop(t, job)
        stop = {tnode, f[4], f[5]}
      else
        table.remove(minsts, tn)
      end
    else
      idle(t)
    end
  end
  -- The idle instances the move's reserve removed from the target's way ('mig_gone'): the move's first ops
  -- destroy them on the node, and those may not have run (the node registry may not even have consumed the move
  -- order). Dropping them showed their slices free while the node still held them, and placements there
  -- failed for overlap until jobs ran out of attempts. They come back 'retiring' (taken, never reused) and are
  -- named ('gpu|id,id') for the registry to send each a destroy_idle: its confirmation drops them (a node that
  -- destroyed them already confirms at once), its failure idles them. One that overlaps an instance the GPU
  -- holds now (the target, kept) is left out: the node made the target, so the move's ops ran.
  local back = give_back(minsts, redis.call('HGET', jkey, 'mig_gone'), 'retiring')
  save_gpu(mkey, minsts, #back > 0 and 'claim' or true)
  if #back > 0 then given = f[4] .. '|' .. table.concat(back, ',') end
end
if f[4] or st == 'migrating' then redis.call('HDEL', jkey, 'mig_gpu', 'mig_inst', 'mig_gone') end
if report ~= '' then redis.call('HSET', jkey, 'xid', report) end
if ARGV[3] == 'pending' then
  requeue(job, st, ARGV[4], now)
else
  set_state(job, st, ARGV[3], ARGV[4], now)
end
local gm = redis.call('HMGET', gk(f[2]), 'inst', 'model', 'index')
local res = {'ok', ARGV[3], f[2], f[6] or '', profile, gm[1], ver, gm[2] or '', gm[3] or '0', freed_raw or f[7] or ''}
if stop or given ~= '' or #stops > 0 then
  table.insert(res, stop and stop[1] or ''); table.insert(res, stop and stop[2] or '')
  table.insert(res, stop and stop[3] or ''); table.insert(res, given)
end
if #stops > 0 then table.insert(res, cjson.encode(stops)) end
return res

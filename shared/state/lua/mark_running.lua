-- mark_running: the executor started the job on its reserved instance(s) (a place's cmd_done; an older executor's
-- job_started). No version bump: a reserved instance already occupies its slices, so no decision changes.
-- KEYS[2] job hash. ARGV: job_id, instance_id, now, cmd_id, attempt (of the place command; '' = unknown), node,
-- the instance the node reports as JSON {profile, start, size, compute} ('' = none)
-- A place command of an attempt older than the job's (it timed out, or the job was re-queued, re-placed, failed,
-- finished or cancelled since) that started the job on an instance the job's active placement does not name is
-- a run nobody expects: {'stop', state}, and the registry stops it. Its instance is held for it (hold_for_stop,
-- as a registration does) until the node confirms (node.lua 'stopped'); the job is left as it is, but for its
-- field 'late' (the attempts whose late run was handled). One that started it on the instance the job's placement
-- names now is that placement's run (one run per job and instance on a node): field 'ra' ('<attempts>:<attempt>',
-- valid while the job's attempts stay <attempts>) records whose run it is, so that its exit is not taken for an
-- earlier placement's (release.lua).
local job, jkey = ARGV[1], KEYS[2]
local f = redis.call('HMGET', jkey, 'state', 'gpu', 'inst', 'slots', 'attempts', 'node')
if ARGV[4] ~= '' then redis.call('HDEL', CMDS, ARGV[4]) end
-- The late run's instance, on the reporting node, stays taken: a free or idle one is held for the job (re-created
-- when the failed placement had removed it); one held for another job, or overlapping another instance, is left
-- alone (only the stop). A node that is not up holds nothing: its resync stops every workload.
local function hold_late(node, iid, raw)
  if redis.call('HGET', nk(node), 'state') ~= 'up' then return end
  local gid = string.match(iid, '^([^:]+):')
  local key = gid and gk(gid)
  if not key or redis.call('HGET', key, 'node') ~= node or redis.call('HGET', key, 'mig') ~= '1' then return end
  local insts = decode_insts(redis.call('HGET', key, 'inst'))
  local _, i = find(insts, iid)
  if i then
    if i.job or (i.state ~= 'idle' and i.state ~= 'retiring') then return end
    hold_for_stop(i, job)
  else
    if raw == '' then return end
    local r = cjson.decode(raw)
    local new = {id = iid, profile = r.profile, start = r.start, size = r.size, compute = r.compute}
    for _, x in ipairs(insts) do if bit.band(imask(x), imask(new)) ~= 0 then return end end
    hold_for_stop(new, job)
    table.insert(insts, new)
  end
  save_gpu(key, insts, 'claim')
end
local slots = job_slots(f[2], f[3], f[4])
local function member_of(node)
  for _, sl in ipairs(slots) do if node_of(sl[1]) == node then return true end end
  return false
end
local attempt = tonumber(ARGV[5] or '')
if f[1] and attempt and attempt < tonumber(f[5] or '0') then
  local active = f[1] == 'placing' or f[1] == 'running' or f[1] == 'migrating'
  if ARGV[2] == '' then
    -- a plain binding reports no instance: one run per job per node, so on the node of the job's active
    -- placement it cannot be told from that one (left as before); elsewhere it is stopped
    if not (active and (f[6] == ARGV[6] or member_of(ARGV[6]))) then return {'stop', f[1]} end
  elseif not (active and names(job, ARGV[2])) then
    -- once per command ('late' lists the attempts handled): a cmd_done redelivered after the node confirmed
    -- the stop must not hold the instance again, as the stop it sends again is the same message (dropped)
    local seen, tag = redis.call('HGET', jkey, 'late') or ',', tostring(attempt) .. ','
    if not string.find(seen, ',' .. tag, 1, true) then
      hold_late(ARGV[6], ARGV[2], ARGV[7] or '')
      redis.call('HSET', jkey, 'late', seen .. tag)
    end
    return {'stop', f[1]}
  end
end
if f[1] ~= 'placing' then return {'noop', f[1] or ''} end
local across = spans(slots)
if ARGV[2] ~= '' and ARGV[2] ~= f[3] and not (across and names(job, ARGV[2])) then return {'stale', f[1]} end
local held = slot_insts(job, slots)
-- a gang across nodes: each member node starts its own slots (another member's may be gone already: it
-- completed); the job runs once none is still reserved
local waiting = false
for _, e in ipairs(held) do
  if across and node_of(e.gid) ~= ARGV[6] then
    if e.i and e.i.state == 'reserved' then waiting = true end
    e.skip = true
  elseif not e.i then
    return {'gone', f[1]}
  end
end
for _, e in ipairs(held) do if not e.skip then
  local was_idle = e.i.state == 'idle'
  e.i.state = 'busy'; e.i.started = tonumber(ARGV[3]); e.i.created = nil
  if was_idle then
    save_gpu(e.key, e.insts, false)
  else
    -- neither counter moves and reserved -> busy leaves the busy mask as it was: only the instances change
    -- (save_gpu would read and rewrite both counters and rewrite the occupancy byte, all unchanged)
    redis.call('HSET', e.key, 'inst', encode_insts(e.insts))
  end
end end
if attempt and attempt < tonumber(f[5] or '0') then redis.call('HSET', jkey, 'ra', f[5] .. ':' .. attempt) end
if waiting then
  hist(job, 'placing', 'placing', 'node ' .. ARGV[6] .. ' started its part of the gang', tonumber(ARGV[3]))
  return {'ok', 'placing'}
end
set_state(job, 'placing', 'running', 'executor started the workload', tonumber(ARGV[3]))
return {'ok', 'running'}

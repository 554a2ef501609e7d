-- fail_placement: the executor could not apply a placement. The reservation is released on every slot (a
-- created instance is removed, a reused one is idle again) and the job re-queued, or failed after max_attempts.
-- KEYS[2] job hash. ARGV: job_id, reason, now, max_attempts, cmd_id, attempt (of the place command; '' = unknown)
-- Returns {status, state, the GPUs freed (comma-separated), member stops (JSON {node, gpu, instance} per node
-- of a gang across nodes whose part started already: it is held until that node confirms a stop)}.
-- A command of an older attempt than the job's (applied or timed out after the job was re-queued) says nothing
-- about the job's current placement: a no-op.
local job, jkey = ARGV[1], KEYS[2]
local now = tonumber(ARGV[3])
if ARGV[5] ~= '' then redis.call('HDEL', CMDS, ARGV[5]) end
local f = redis.call('HMGET', jkey, 'state', 'gpu', 'inst', 'attempts', 'preempted', 'slots')
if f[1] ~= 'placing' then return {'noop', f[1] or '', ''} end
local attempt = tonumber(ARGV[6] or '')
if attempt and attempt < tonumber(f[4] or '0') then return {'noop', f[1], ''} end
local gpus, stops = {}, {}
local slots = job_slots(f[2], f[3], f[6])
for _, s in ipairs(slots) do table.insert(gpus, s[1]) end
-- a gang across nodes: the members that started already run their part; it stays taken until each stops
if spans(slots) then
  local started = {}
  for _, e in ipairs(slot_insts(job, slots)) do
    if e.i and e.i.state == 'busy' then started[node_of(e.gid)] = true end
  end
  local keep = {}
  for _, s in ipairs(slots) do if started[node_of(s[1])] then table.insert(keep, s) end end
  if #keep > 0 then stops = hold_members(job, keep, '') end
end
for _, e in ipairs(slot_insts(job, slots)) do
  if e.i and e.i.state ~= 'retiring' then vacate(e.insts, e.i.id, job, true) end
  save_gpu(e.key, e.insts, true)
end
gpus = table.concat(gpus, ',')  -- a gang frees several GPUs
-- preemptions count as attempts (each placement needs its own command id) but never fail a job
if tonumber(f[4] or '0') - tonumber(f[5] or '0') + 1 >= tonumber(ARGV[4]) then
  redis.call('HINCRBY', jkey, 'attempts', 1)
  set_state(job, 'placing', 'failed', ARGV[2], now)
  return {'ok', 'failed', gpus, #stops > 0 and cjson.encode(stops) or ''}
end
requeue(job, 'placing', ARGV[2], now)
return {'ok', 'pending', gpus, #stops > 0 and cjson.encode(stops) or ''}

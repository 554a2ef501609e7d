-- instance: an idle instance's own life. KEYS[2] gpu hash. ARGV: op, instance_id, now
--   retire  idle -> retiring (a destroy command is on its way; its slices stay occupied until it is gone)
--   drop    retiring|idle -> removed (the executor destroyed it)
--   restore retiring -> idle (the destroy failed; it is reusable again)
-- A retiring instance that holds a job (found running it at registration, see node.lua) is left alone: only
-- the job's stop frees it.
local op, id, gkey = ARGV[1], ARGV[2], KEYS[2]
if redis.call('EXISTS', gkey) == 0 then return {'nogpu', 0} end
local insts = decode_insts(redis.call('HGET', gkey, 'inst'))
local n, i = find(insts, id)
if not i then return {'gone', 0} end
if op == 'retire' then
  if i.state ~= 'idle' then return {'busy', 0} end
  i.state = 'retiring'
elseif op == 'drop' then
  if (i.state ~= 'retiring' and i.state ~= 'idle') or i.job then return {'busy', 0} end
  table.remove(insts, n)
elseif op == 'restore' then
  if i.state ~= 'retiring' or i.job then return {'noop', 0} end
  i.state = 'idle'
end
return {'ok', save_gpu(gkey, insts, op == 'retire' and 'claim' or true)}

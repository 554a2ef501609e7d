-- dump: a consistent read of a whole shard for the audit (read-only; blocks Redis for O(GPUs + jobs)).
-- Returns {occ, {gpu_id, {field, value, ...}, ...}, {pending ids},
--   {job_id, state, gpu, inst, mig_gpu, mig_inst, slots, tenant, usage, charged, ...}, {ended job ids (':done')},
--   {the usage counters: field, value, ...}}
local occ = redis.call('GET', OCC) or ''
local gpus = {}
for _, id in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  table.insert(gpus, id)
  table.insert(gpus, redis.call('HGETALL', gk(id)))
end
local jobs = {}
for _, id in ipairs(redis.call('SMEMBERS', JOBS)) do
  local f = redis.call('HMGET', jk(id), 'state', 'gpu', 'inst', 'mig_gpu', 'mig_inst', 'slots', 'tenant', 'usage',
    'charged')
  table.insert(jobs, id)
  for n = 1, 9 do table.insert(jobs, f[n] or '') end
end
return {occ, gpus, redis.call('ZRANGE', PENDING, 0, -1), jobs, redis.call('ZRANGE', DONE, 0, -1),
  redis.call('HGETALL', USAGE)}

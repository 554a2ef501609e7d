-- recount_usage: the shard's usage counters rebuilt from its jobs, in one step: every active job with a tenant is
-- counted with the charge stored with it, and no other job is. A repair (`migsched quota recount`) for
-- counters that drifted, or that jobs placed before the counters existed are missing from. O(jobs of the
-- shard, ended ones kept for their retention included): it blocks Redis while it runs. Returns the jobs counted.
redis.call('DEL', USAGE)
local n = 0
for _, id in ipairs(redis.call('SMEMBERS', JOBS)) do
  local f = redis.call('HMGET', jk(id), 'state', 'tenant', 'usage', 'charged')
  if ACTIVE[f[1]] and f[2] and f[2] ~= '' then
    for resource, amount in pairs(cjson.decode(f[3] or '{}')) do
      redis.call('HINCRBYFLOAT', USAGE, usage_field(f[2], resource), amount)
    end
    if not f[4] then redis.call('HSET', jk(id), 'charged', '1') end
    n = n + 1
  elseif f[4] then
    redis.call('HDEL', jk(id), 'charged')
  end
end
return n

-- route: where a job lives when it cannot live in its home shard (crc32 of its id). Run in the home shard:
-- ':routes' (hash job -> "<shard>:<routed at>") names the shard a job was sent to. A job is routed once, before
-- any record of it exists; after that every process finds it there. ARGV: job, the shard wanted, now. Returns
-- the shard the job lives in: the one routed earlier (a redelivered submit, or another balancer replica that
-- chose first), -1 when its record is already in this shard (it lives at home), else the one wanted, recorded.
local job = ARGV[1]
local ROUTES = P .. ':routes'
local got = redis.call('HGET', ROUTES, job)
if got then return tonumber(string.match(got, '^(%d+)')) end
if redis.call('EXISTS', jk(job)) == 1 then return -1 end
redis.call('HSET', ROUTES, job, ARGV[2] .. ':' .. ARGV[3])
return tonumber(ARGV[2])

-- settle: a job-only transition (no GPU): pending -> rejected | cancelled, or a tombstone for an unknown job.
-- KEYS[2] job hash. ARGV: job_id, to, reason, now, from_csv (allowed current states; '-' allows unknown),
-- spec (optional: the submit, kept for an unknown job so that what it asked stays readable)
local job, jkey = ARGV[1], KEYS[2]
local st = redis.call('HGET', jkey, 'state') or '-'
local ok = false
for s in string.gmatch(ARGV[5], '[^,]+') do if s == st then ok = true end end
if not ok then return {'noop', st} end
if st == 'pending' then redis.call('ZREM', PENDING, job) end
if st == '-' then
  redis.call('SADD', JOBS, job)
  if ARGV[6] and ARGV[6] ~= '' then redis.call('HSET', jkey, 'spec', ARGV[6]) end
  st = ''
end
set_state(job, st, ARGV[2], ARGV[3], tonumber(ARGV[4]))
return {'ok', ARGV[2]}

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
  local v = redis.call('HMGET', key, 'rev', 'ver')
  local rev, ver = tonumber(v[1] or '0'), tonumber(v[2] or '0')
  if bump then rev = rev + 1 end
  if bump == 'claim' then ver = ver + 1 end
  redis.call('HSET', key, 'inst', encode_insts(insts), 'rev', rev, 'ver', ver)
  local pos = tonumber(redis.call('HGET', key, 'pos'))
  redis.call('SETRANGE', OCC, pos, string.char(busy_mask(insts)))
  return ver
end
local function find(insts, id)
  for n, i in ipairs(insts) do if i.id == id then return n, i end end
  return nil, nil
end
local function hist(job, from, to, reason, now)
  redis.call('RPUSH', hk(job), cjson.encode({at = now, ['from'] = from, to = to, reason = reason}))
  redis.call('LTRIM', hk(job), -64, -1)
end
local function set_state(job, from, to, reason, now)
  redis.call('HSET', jk(job), 'state', to, 'reason', reason, 'updated', now)
  hist(job, from, to, reason, now)
  -- jobs in placing, by when: a placement whose command never went out is found and re-queued
  if to == 'placing' then redis.call('ZADD', PLACING, now, job)
  elseif from == 'placing' then redis.call('ZREM', PLACING, job) end
end
local function prio_score(prio, at) return (1000 - prio) * 1e10 + at end
local function requeue(job, from, reason, now)
  local f = redis.call('HMGET', jk(job), 'prio', 'at')
  redis.call('HINCRBY', jk(job), 'attempts', 1)
  redis.call('HDEL', jk(job), 'gpu', 'inst', 'node', 'mig_gpu', 'mig_inst')
  redis.call('ZADD', PENDING, prio_score(tonumber(f[1] or '0'), tonumber(f[2] or '0')), job)
  set_state(job, from, 'pending', reason, now)
end
local function idle(i)
  i.state = 'idle'; i.job = nil; i.prio = nil; i.ls = nil; i.mig = nil; i.tenant = nil; i.started = nil
  i.created = nil; i.pre = nil
end

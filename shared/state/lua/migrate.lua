-- migrate: make-before-break moves. KEYS[2] job hash.
--   reserve  ARGV: 'reserve', job_id, now, src_instance, dst_gpu, dst_expected_ver, dst_instance_json,
--            destroy_json, max_count, cooldown_s, reason
--            running -> migrating; the target instance is reserved ('target') and the source marked moved now
--   commit   ARGV: 'commit', job_id, now, reason   migrating -> running on the target; the source is idle
--   abort    ARGV: 'abort', job_id, now, reason[, gone, node, target]
--            migrating -> running on the source; the target is removed. The idle instances the reserve removed
--            from the target's way (the job's 'mig_gone') come back: gone = 'idle' (the move's command never
--            went out: they are untouched) restores them idle; otherwise (the node failed the move, before or
--            after its destroy ops) they are kept 'retiring' and returned as 'gpu|id,id' for the node registry to
--            send each a destroy_idle (its confirmation drops it, its failure idles it). One that overlaps an
--            instance written since is left out. On a job no longer migrating (its exit came first) the
--            target a release kept 'retiring' for a stop on the target's node (release.lua) is dropped: the
--            node undid it. node and target (the instance id's tail ':<job>.<nonce>') name it.
local op, job, jkey = ARGV[1], ARGV[2], KEYS[2]
local now = tonumber(ARGV[3])
local f = redis.call('HMGET', jkey, 'state', 'gpu', 'inst', 'mig_gpu', 'mig_inst')
if op == 'reserve' then
  if f[1] ~= 'running' then return {'state', f[1] or ''} end
  if f[3] ~= ARGV[4] then return {'moved', f[3] or ''} end
  local skey, dkey = gk(f[2]), gk(ARGV[5])
  local sinsts = decode_insts(redis.call('HGET', skey, 'inst'))
  local _, src = find(sinsts, f[3])
  if not src or src.job ~= job then return {'gone', f[3]} end
  -- a job on a whole GPU or a time-sliced share (or a gang) never moves: plain slots have no MIG geometry
  if src.mig == false or is_plain(src) or redis.call('HEXISTS', jkey, 'slots') == 1 then return {'pinned', ''} end
  if (src.moved or 0) > 0 and (src.moved + tonumber(ARGV[10])) > now then return {'cooldown', tostring(src.moved)} end
  local d = redis.call('HMGET', dkey, 'ver', 'healthy', 'mig')
  if not d[1] then return {'nogpu', ARGV[5]} end
  if tonumber(d[1]) ~= tonumber(ARGV[6]) then return {'conflict', d[1]} end
  if d[2] ~= '1' then return {'unhealthy', ARGV[5]} end
  if d[3] == '0' then return {'mode', ARGV[5]} end
  local same_gpu = (skey == dkey)
  local dinsts = sinsts
  if not same_gpu then dinsts = decode_insts(redis.call('HGET', dkey, 'inst')) end
  local gone = {}
  for _, id in ipairs(cjson.decode(ARGV[8])) do
    local n, i = find(dinsts, id)
    if i then
      if i.state ~= 'idle' then return {'busy', id} end
      table.remove(dinsts, n)
      table.insert(gone, i)
    end
  end
  local new = cjson.decode(ARGV[7])
  local m = imask(new)
  local same = 0
  for _, i in ipairs(dinsts) do
    if bit.band(imask(i), m) ~= 0 then return {'overlap', i.id} end
    if i.profile == new.profile then same = same + 1 end
  end
  if same >= tonumber(ARGV[9]) then return {'count', new.profile} end
  new.state = 'target'; new.job = job; new.prio = src.prio; new.ls = src.ls; new.mig = false
  new.tenant = src.tenant; new.created = true
  table.insert(dinsts, new)
  local _, s2 = find(dinsts, f[3])  -- same GPU: the source lives in the same table
  if same_gpu and s2 then s2.moved = now else src.moved = now end
  if not same_gpu then save_gpu(skey, sinsts, true) end
  save_gpu(dkey, dinsts, 'claim')
  redis.call('HSET', jkey, 'mig_gpu', ARGV[5], 'mig_inst', new.id)
  if #gone > 0 then redis.call('HSET', jkey, 'mig_gone', encode_insts(gone)) end
  set_state(job, 'running', 'migrating', ARGV[11], now)
  return {'ok', new.id}
end
if f[1] ~= 'migrating' then
  if op == 'abort' and (ARGV[6] or '') ~= '' and (ARGV[7] or '') ~= '' then
    local tail = ARGV[7]
    for _, id in ipairs(cjson.decode(redis.call('HGET', nk(ARGV[6]), 'gpus') or '[]')) do
      local key = gk(id)
      local insts = decode_insts(redis.call('HGET', key, 'inst'))
      for n = #insts, 1, -1 do
        local i = insts[n]
        if i.state == 'retiring' and i.job == job and #i.id > #tail and string.sub(i.id, -#tail) == tail then
          table.remove(insts, n)
          save_gpu(key, insts, true)
        end
      end
    end
  end
  return {'noop', f[1] or ''}
end
local skey, dkey = gk(f[2]), gk(f[4])
local sinsts = decode_insts(redis.call('HGET', skey, 'inst'))
local dinsts = sinsts
if skey ~= dkey then dinsts = decode_insts(redis.call('HGET', dkey, 'inst')) end
local _, src = find(sinsts, f[3])
local tn, dst = find(dinsts, f[5])
if op == 'commit' then
  if dst then
    dst.state = 'busy'; dst.mig = (src and src.mig ~= false) and true or false; dst.moved = now
    dst.started = (src and src.started) or now; dst.created = nil; dst.ends = (src and src.ends) or dst.ends
  end
  if src and src.job == job then idle(src) end
  -- a cross-node move also moves the job's node (where stop and migrate_stop commands must go)
  redis.call('HSET', jkey, 'gpu', f[4], 'inst', f[5], 'node', redis.call('HGET', dkey, 'node') or '')
  redis.call('HDEL', jkey, 'mig_gpu', 'mig_inst', 'mig_gone')
  if skey ~= dkey then save_gpu(skey, sinsts, true) end
  save_gpu(dkey, dinsts, true)
  set_state(job, 'migrating', 'running', ARGV[4], now)
  return {'ok', f[2] .. '|' .. f[3]}
end
-- abort
if dst and dst.job == job then table.remove(dinsts, tn) end
local back = give_back(dinsts, redis.call('HGET', jkey, 'mig_gone'), ARGV[5] == 'idle' and 'idle' or 'retiring')
redis.call('HDEL', jkey, 'mig_gpu', 'mig_inst', 'mig_gone')
if skey ~= dkey then save_gpu(skey, sinsts, true) end
save_gpu(dkey, dinsts, #back > 0 and 'claim' or true)
set_state(job, 'migrating', 'running', ARGV[4], now)
if #back > 0 and ARGV[5] ~= 'idle' then return {'ok', f[4] .. '|' .. table.concat(back, ',')} end
return {'ok', ''}

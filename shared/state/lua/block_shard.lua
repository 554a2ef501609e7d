-- block_shard: the shard of a topology block (a node's ``block`` label), chosen once, when its first node
-- registers, and kept. Not prepended by the prelude: KEYS[1] is the namespace's block map (hash block ->
-- shard), a key of its own slot. ARGV: block, shards, the block's shard order (comma list: the shard of its
-- name's crc32, then the next ones). A new block goes to the shard holding the fewest blocks, ties to the first
-- in its order (shared.state.sharding.block_shard); an entry naming a shard that no longer exists (fewer shards
-- now) is chosen again. Returns the shard.
local block, shards = ARGV[1], tonumber(ARGV[2])
local got = tonumber(redis.call('HGET', KEYS[1], block) or '')
if got and got < shards then return got end
local counts = {}
for s = 0, shards - 1 do counts[s] = 0 end
for _, v in ipairs(redis.call('HVALS', KEYS[1])) do
  local s = tonumber(v)
  if s and counts[s] then counts[s] = counts[s] + 1 end
end
local best = nil
for tok in string.gmatch(ARGV[3], '%d+') do
  local s = tonumber(tok)
  if best == nil or counts[s] < counts[best] then best = s end
end
redis.call('HSET', KEYS[1], block, best)
return best

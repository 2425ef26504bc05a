"""The balancer's Lua scripts: each balancer operation is one atomic script run.

KEYS are the balancer's fixed keys (built in ``farm.constants``); a backend's hash key is
``ARGV[1] .. backend_id`` (the prefix comes from ``llm_backend_key("")``). Lease expiry is in ms
from the Redis server's own clock, so workers with skewed clocks agree.

Scores: ``inflight / capacity``. Lua numbers passed to ``redis.call`` are formatted with 14
significant digits, identically for equal fractions, so tied backends get equal scores.
"""

from __future__ import annotations

# KEYS (all scripts): 1 heap, 2 jobs, 3 leases, 4 seq, 5 moves, 6 backends, 7 last chosen (backend -> seq).
# ARGV: 1 backend prefix, 2 reap limit, then per script.
_PRELUDE = """
local heap, jobs, leases = KEYS[1], KEYS[2], KEYS[3]
local prefix, reap_limit = ARGV[1], tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

-- The heap score of a backend with n jobs in flight, given its 'healthy' and 'capacity' fields.
local function score(b, n, healthy, capacity)
  if healthy == '1' then redis.call('ZADD', heap, n / tonumber(capacity), b) end
end

local function rescore(b)
  local f = redis.call('HMGET', prefix .. b, 'healthy', 'inflight', 'capacity')
  score(b, tonumber(f[2]), f[1], f[3])
end

local function unload(b)
  local key = prefix .. b
  local f = redis.call('HMGET', key, 'healthy', 'capacity')
  if not f[2] then return end  -- the backend is gone (every registered backend has a capacity)
  local n = redis.call('HINCRBY', key, 'inflight', -1)
  if n < 0 then
    redis.call('HSET', key, 'inflight', 0)
    n = 0
  end
  score(b, n, f[1], f[2])
end

-- Abandoned jobs (lease expired) give their slot back; bounded so one call stays fast.
local function reap()
  local expired = redis.call('ZRANGEBYSCORE', leases, '-inf', now, 'LIMIT', 0, reap_limit)
  for _, j in ipairs(expired) do
    local b = redis.call('HGET', jobs, j)
    redis.call('HDEL', jobs, j)
    redis.call('ZREM', leases, j)
    if b then unload(b) end
  end
  return #expired
end
"""

# ARGV: 3 job id, 4 lease ttl ms, 5 max moves kept, 6 max tied backends scanned.
# Returns {backend, url, kind, model, moved_from or ''}, or false when no backend is healthy.
ACQUIRE = (
    _PRELUDE
    + """
local seq, moves, chosen = KEYS[4], KEYS[5], KEYS[7]
local job, ttl, max_moves, max_ties = ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
reap()
local moved_from = ''
local cur = redis.call('HGET', jobs, job)
if cur then
  local f = redis.call('HMGET', prefix .. cur, 'healthy', 'url', 'kind', 'model')
  if f[1] == '1' then
    redis.call('ZADD', leases, now + ttl, job)
    return {cur, f[2], f[3], f[4], ''}
  end
  -- Its backend is dead or gone: give the slot back and route the job afresh.
  unload(cur)
  redis.call('HDEL', jobs, job)
  redis.call('ZREM', leases, job)
  moved_from = cur
end
local first = redis.call('ZRANGE', heap, 0, 0, 'WITHSCORES')
if #first == 0 then return false end
local best = first[1]
local tied = redis.call('ZRANGEBYSCORE', heap, first[2], first[2], 'LIMIT', 0, max_ties)
if #tied > 1 then
  local seqs = redis.call('HMGET', chosen, unpack(tied))
  local best_seq = nil
  for i, b in ipairs(tied) do
    local s = tonumber(seqs[i] or '0')
    if best_seq == nil or s < best_seq then best, best_seq = b, s end
  end
end
local key = prefix .. best
local f = redis.call('HMGET', key, 'healthy', 'capacity', 'url', 'kind', 'model')
score(best, redis.call('HINCRBY', key, 'inflight', 1), f[1], f[2])
redis.call('HSET', chosen, best, redis.call('INCR', seq))
redis.call('HSET', jobs, job, best)
redis.call('ZADD', leases, now + ttl, job)
if moved_from ~= '' then
  redis.call('LPUSH', moves, cjson.encode({job = job, from = moved_from, to = best, at_ms = now}))
  redis.call('LTRIM', moves, 0, max_moves - 1)
end
return {best, f[3], f[4], f[5], moved_from}
"""
)

# ARGV: 3 job id. Returns 1 if the job held a backend, else 0.
RELEASE = (
    _PRELUDE
    + """
reap()
local b = redis.call('HGET', jobs, ARGV[3])
if not b then return 0 end
redis.call('HDEL', jobs, ARGV[3])
redis.call('ZREM', leases, ARGV[3])
unload(b)
return 1
"""
)

# Reclaims the slots of expired leases only. Returns how many were reaped.
REAP = _PRELUDE + "\nreturn reap()\n"

# KEYS: 1 heap, 6 backends set, 7 last chosen. ARGV: 3 id, 4 url, 5 kind, 6 model, 7 capacity. Returns 1 if it existed.
ADD_BACKEND = (
    _PRELUDE
    + """
local id = ARGV[3]
local key = prefix .. id
local existed = redis.call('EXISTS', key)
redis.call('HSET', key, 'url', ARGV[4], 'kind', ARGV[5], 'model', ARGV[6], 'capacity', ARGV[7])
if existed == 0 then
  redis.call('HSET', key, 'inflight', 0, 'healthy', 1, 'fails', 0)
  redis.call('HSET', KEYS[7], id, 0)
end
redis.call('SADD', KEYS[6], id)
rescore(id)
return existed
"""
)

# ARGV: 3 id. Sticky jobs of other backends are untouched; this backend's jobs move on their next acquire.
REMOVE_BACKEND = (
    _PRELUDE
    + """
redis.call('ZREM', heap, ARGV[3])
redis.call('SREM', KEYS[6], ARGV[3])
redis.call('HDEL', KEYS[7], ARGV[3])
return redis.call('DEL', prefix .. ARGV[3])
"""
)

# ARGV: 3 id, 4 ok (1/0), 5 failures before ejection. Returns {healthy before, healthy after} or {-1, -1}.
PROBE = (
    _PRELUDE
    + """
local key = prefix .. ARGV[3]
if redis.call('EXISTS', key) == 0 then return {-1, -1} end
local was = redis.call('HGET', key, 'healthy') == '1' and 1 or 0
if ARGV[4] == '1' then
  redis.call('HSET', key, 'healthy', 1, 'fails', 0)
  rescore(ARGV[3])
  return {was, 1}
end
if redis.call('HINCRBY', key, 'fails', 1) >= tonumber(ARGV[5]) then
  redis.call('HSET', key, 'healthy', 0)
  redis.call('ZREM', heap, ARGV[3])
  return {was, 0}
end
return {was, was}
"""
)

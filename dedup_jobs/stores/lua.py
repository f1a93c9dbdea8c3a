"""Every Lua script of the django-redis store, in one place.

A lock is a hash (owner, state, acquired, expires, task, id) with a PEXPIRE; the index is a
sorted set of lock keys scored by their expiry (ms), so held locks can be listed and paginated
without KEYS and stale entries trimmed by score. Times come from the Redis server's own clock
(TIME), so clients with skewed clocks agree; ARGV "now ms" is kept only for the call shape.
On a Redis Cluster all keys of one script must share a slot: put a hash tag in the
KEY_PREFIX (e.g. "{dedup_jobs}").
"""

# ACQUIRE — take a free lock (or refresh one the caller already holds, when reentrant).
# KEYS[1] lock key, KEYS[2] index key
# ARGV[1] owner, ARGV[2] ttl ms, ARGV[3] unused (server TIME), ARGV[4] reentrant "1"/"0",
# ARGV[5] task name, ARGV[6] readable id
# Returns {1, owner} when taken, {0, holder} when another owner holds it.
ACQUIRE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local cur = redis.call('HGET', KEYS[1], 'owner')
if cur and (ARGV[4] ~= '1' or cur ~= ARGV[1]) then
  return {0, cur}
end
local expires = now + tonumber(ARGV[2])
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'state', 'queued', 'acquired', now,
           'expires', expires, 'task', ARGV[5], 'id', ARGV[6])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', '(' .. now)
redis.call('ZADD', KEYS[2], expires, KEYS[1])
return {1, ARGV[1]}
"""

# START — the worker-side check before run.
# KEYS[1] lock key, KEYS[2] index key
# ARGV[1] owner, ARGV[2] lease ms, ARGV[3] unused (server TIME), ARGV[4] release "1"/"0",
# ARGV[5] task name, ARGV[6] readable id
# Returns {0, holder} when another owner holds it (skip); otherwise runs and returns
# {1, 'released'} (release and the caller held it), {1, 'free'} (release, nothing held),
# {1, 'taken'} (was free, now running under the caller) or {1, 'held'} (caller's, now running).
START = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local cur = redis.call('HGET', KEYS[1], 'owner')
if cur and cur ~= ARGV[1] then
  return {0, cur}
end
if ARGV[4] == '1' then
  if cur then
    redis.call('DEL', KEYS[1])
    redis.call('ZREM', KEYS[2], KEYS[1])
    return {1, 'released'}
  end
  return {1, 'free'}
end
local expires = now + tonumber(ARGV[2])
if not cur then
  redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'acquired', now, 'task', ARGV[5],
             'id', ARGV[6])
end
redis.call('HSET', KEYS[1], 'state', 'running', 'expires', expires)
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('ZADD', KEYS[2], expires, KEYS[1])
if cur then return {1, 'held'} end
return {1, 'taken'}
"""

# RELEASE — compare-and-delete by owner token.
# KEYS[1] lock key, KEYS[2] index key; ARGV[1] owner
# Returns 1 when the caller's lock was deleted, 0 otherwise (free, or another owner's).
RELEASE = """
if redis.call('HGET', KEYS[1], 'owner') == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('ZREM', KEYS[2], KEYS[1])
  return 1
end
return 0
"""

# RENEW — extend the caller's lock so it expires no sooner than now + ttl; never shortens.
# KEYS[1] lock key, KEYS[2] index key; ARGV[1] owner, ARGV[2] ttl ms, ARGV[3] unused (server TIME)
# Returns 1 when the caller holds the lock (extended or already long enough), 0 otherwise.
RENEW = """
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then
  return 0
end
local ttl = tonumber(ARGV[2])
if redis.call('PTTL', KEYS[1]) < ttl then
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local expires = now + ttl
  redis.call('PEXPIRE', KEYS[1], ttl)
  redis.call('HSET', KEYS[1], 'expires', expires)
  redis.call('ZADD', KEYS[2], expires, KEYS[1])
end
return 1
"""

"""Every Lua script of the django-redis store, in one place.

A lock is a hash (owner, state, acquired, expires, task, id) with a PEXPIRE; the index is a
sorted set of lock keys scored by their expiry (ms), so held locks can be listed and paginated
without KEYS and stale entries trimmed by score. Times come from the Redis server's own clock
(TIME), so clients with skewed clocks agree; ARGV "now ms" is kept only for the call shape.
On a Redis Cluster all keys of one script must share a slot: put a hash tag in the
KEY_PREFIX (e.g. "{dedup_jobs}").
"""

import hashlib

# ACQUIRE — take a free lock (or refresh one the caller already holds, when reentrant).
# KEYS[1] lock key, KEYS[2] index key
# ARGV[1] owner, ARGV[2] ttl ms, ARGV[3] unused (server TIME), ARGV[4] reentrant "1"/"0",
# ARGV[5] task name, ARGV[6] readable id
# Returns "1" .. owner when taken, "0" .. holder when another owner holds it: one bulk
# string, the cheapest reply to read. The server clock is read only once the lock is known
# to be free: a duplicate costs one HGET. Index entries of expired locks are trimmed here
# about one time in 16 (by the microseconds of TIME) and on every RELEASE: off the dispatch
# path, where each command inside the script is paid by the caller.
ACQUIRE = """
local cur = redis.call('HGET', KEYS[1], 'owner')
if cur and (ARGV[4] ~= '1' or cur ~= ARGV[1]) then
  return '0' .. cur
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local expires = now + tonumber(ARGV[2])
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'state', 'queued', 'acquired', now,
           'expires', expires, 'task', ARGV[5], 'id', ARGV[6])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
if tonumber(t[2]) % 16 == 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', '(' .. now)
end
redis.call('ZADD', KEYS[2], expires, KEYS[1])
return '1' .. ARGV[1]
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

# RELEASE — compare-and-delete by owner token (and trim index entries of expired locks).
# KEYS[1] lock key, KEYS[2] index key; ARGV[1] owner
# Returns 1 when the caller's lock was deleted, 0 otherwise (free, or another owner's).
RELEASE = """
if redis.call('HGET', KEYS[1], 'owner') == ARGV[1] then
  redis.call('DEL', KEYS[1])
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', '(' .. now)
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

# RELEASE_QUEUED — an operator's compare-and-delete (clear_stale_locks): only the owner's lock,
# and only while it is still queued, so a job that started in the meantime keeps its lock.
# KEYS[1] lock key, KEYS[2] index key; ARGV[1] owner
# Returns 1 when the lock was deleted, 0 otherwise (free, another owner's, or running).
RELEASE_QUEUED = """
if redis.call('HGET', KEYS[1], 'owner') == ARGV[1]
   and redis.call('HGET', KEYS[1], 'state') ~= 'running' then
  redis.call('DEL', KEYS[1])
  redis.call('ZREM', KEYS[2], KEYS[1])
  return 1
end
return 0
"""

# A pending debounce is a hash (message, latest, payload, first, last, run_at, deadline, count,
# task, id) beside a list of every dispatch id of the burst ("{state key}:ids"); the index
# "{KEY_PREFIX}:index:debounce" is a sorted set of state keys scored by when they are due (ms).

# DEBOUNCE — one dispatch: start a burst, or absorb the dispatch into the pending one.
# KEYS[1] state hash, KEYS[2] ids list, KEYS[3] debounce index
# ARGV[1] task id, ARGV[2] payload (latest args), ARGV[3] now ms, ARGV[4] debounce_for ms,
# ARGV[5] max_wait ms or "" (none), ARGV[6] ttl ms (how long the state outlives its due time),
# ARGV[7] task name, ARGV[8] readable id
# Returns {1, task id, ""} when it started a burst (the caller publishes its message), or
# {0, message id, superseded id} when it was absorbed.
DEBOUNCE = """
local now = tonumber(ARGV[3])
local run_at = now + tonumber(ARGV[4])
local ttl = tonumber(ARGV[6])
local msg = redis.call('HGET', KEYS[1], 'message')
local prev = false
local deadline
if msg then
  local cur = redis.call('HMGET', KEYS[1], 'latest', 'deadline')
  prev = cur[1]
  deadline = tonumber(cur[2])
  redis.call('HSET', KEYS[1], 'latest', ARGV[1], 'payload', ARGV[2], 'last', now,
             'run_at', run_at)
  redis.call('HINCRBY', KEYS[1], 'count', 1)
else
  msg = ARGV[1]
  redis.call('DEL', KEYS[2])
  if ARGV[5] ~= '' then deadline = now + tonumber(ARGV[5]) end
  redis.call('HSET', KEYS[1], 'message', msg, 'latest', msg, 'payload', ARGV[2],
             'first', now, 'last', now, 'run_at', run_at, 'deadline', deadline or '',
             'count', 1, 'task', ARGV[7], 'id', ARGV[8])
end
redis.call('RPUSH', KEYS[2], ARGV[1])
local due = run_at
if deadline and deadline < due then due = deadline end
redis.call('PEXPIRE', KEYS[1], due - now + ttl)
redis.call('PEXPIRE', KEYS[2], due - now + ttl)
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', '(' .. (now - ttl))
redis.call('ZADD', KEYS[3], due, KEYS[1])
if prev then return {0, msg, prev} end
return {1, msg, ''}
"""

# CLAIM — the burst's message is at the worker: claim the burst if it is due.
# KEYS[1] state hash, KEYS[2] ids list, KEYS[3] debounce index
# ARGV[1] message id, ARGV[2] now ms, ARGV[3] tolerance ms (a timer firing this early is due)
# Returns {"missing"}, {"other", message id}, {"wait", due ms}, or
# {"claimed", latest id, payload, {ids...}} after deleting the state (a later dispatch starts
# a new burst).
CLAIM = """
local s = redis.call('HMGET', KEYS[1], 'message', 'run_at', 'deadline')
if not s[1] then return {'missing'} end
if s[1] ~= ARGV[1] then return {'other', s[1]} end
local due = tonumber(s[2])
local deadline = tonumber(s[3])
if deadline and deadline < due then due = deadline end
if due - tonumber(ARGV[2]) > tonumber(ARGV[3]) then return {'wait', due} end
local v = redis.call('HMGET', KEYS[1], 'latest', 'payload')
local ids = redis.call('LRANGE', KEYS[2], 0, -1)
redis.call('DEL', KEYS[1], KEYS[2])
redis.call('ZREM', KEYS[3], KEYS[1])
return {'claimed', v[1], v[2], ids}
"""

#: SHA1 of every script above, for EVALSHA (computed once, at import)
SHA = {
    name: hashlib.sha1(body.encode("utf-8")).hexdigest()
    for name, body in dict(globals()).items()
    if name.isupper() and isinstance(body, str) and "redis.call" in body
}

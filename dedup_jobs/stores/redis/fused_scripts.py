"""The Lua of the fused dispatch (issue 26, docs/semantics.md#fused): where the Celery broker is
kombu's Redis transport on the store's own server, a unique dispatch takes its lock and pushes
its message onto the queue in one script, one round trip. Imported by ``scripts.py``, which
computes every script's SHA1.

The script runs on the store's connection: the lock in the store's database, the message in
the broker's (``SELECT`` inside the script, and back: before Redis 7 a script's SELECT stayed
on the connection). Both or neither: the script is atomic, refuses to run past the caller's
deadline as ACQUIRE does (a late request changes nothing), and answers a re-send of the same
request (a lost reply) as the first run did without pushing again, also after that first
message has run and released its lock (the receipt ``{lock key}:pub`` answers it for
``2 x budget + 1`` seconds, longer than any re-send waits)."""

from dedup_jobs.stores.redis.trim import trim_lua

#: Lua of the dispatch scripts (ACQUIRE, FUSED) once the lock is known to be free: read the
#: server's clock into ``t``/``now`` and, past the caller's deadline ARGV[3] (ms on the
#: server's clock, "0": none), answer "L" .. now and change nothing (S7)
DISPATCH_CLOCK = """local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local deadline = tonumber(ARGV[3])
if deadline > 0 and now > deadline then
  return 'L' .. now
end
"""

# FUSED — ACQUIRE (not reentrant) and, when the lock is taken, LPUSH of the message.
# KEYS[1] lock key, KEYS[2] index key, KEYS[3] the queue's key (in the broker's database),
# KEYS[4] the receipt ("{lock key}:pub")
# ARGV[1] owner, ARGV[2] ttl ms, ARGV[3] deadline ms (server clock; "0": none), ARGV[4] task
# name, ARGV[5] readable id, ARGV[6] the dispatch's request id, ARGV[7] the store's database,
# ARGV[8] the broker's database, ARGV[9] the message as kombu would push it, ARGV[10] the
# receipt's ttl ms
# Returns as ACQUIRE: "1" .. owner (taken and pushed; or a re-send of that request),
# "0" .. holder (a duplicate: nothing pushed), "L" .. server ms (past the deadline: nothing).
# The message is pushed before anything is written (a script is not rolled back when a
# command in it fails): a push the server refuses (the queue's key of another type) answers
# its error and leaves no lock; the database is switched back first (before Redis 7 a
# script's SELECT stayed on the connection).
FUSED = """
local cur = redis.call('HGET', KEYS[1], 'owner')
if cur then
  if cur == ARGV[1] and redis.call('HGET', KEYS[1], 'req') == ARGV[6] then
    return '1' .. cur
  end
  return '0' .. cur
end
if redis.call('GET', KEYS[4]) == ARGV[6] then return '1' .. ARGV[1] end
""" + DISPATCH_CLOCK + """
if ARGV[8] ~= ARGV[7] then redis.call('SELECT', ARGV[8]) end
local pushed = redis.pcall('LPUSH', KEYS[3], ARGV[9])
if ARGV[8] ~= ARGV[7] then redis.call('SELECT', ARGV[7]) end
if type(pushed) == 'table' and pushed.err then return pushed end
local expires = now + tonumber(ARGV[2])
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'state', 'queued', 'acquired', now,
           'expires', expires, 'task', ARGV[4], 'id', ARGV[5], 'req', ARGV[6])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
if tonumber(t[2]) % 16 == 0 then
""" + trim_lua("KEYS[2]", "now") + """
end
redis.call('ZADD', KEYS[2], expires, KEYS[1])
redis.call('SET', KEYS[4], ARGV[6], 'PX', ARGV[10])
return '1' .. ARGV[1]
"""

# UNFUSE — S7: the undo of a fused dispatch that failed with StoreUnavailable (its reply lost
# or late; engine/rollback.py). Its message is taken back off the queue if still there (LREM
# of the exact payload, which carries a unique delivery tag), and then the lock that very
# request took is deleted. A message a worker has already taken is left with its lock: the
# dispatch happened (both, not neither). A re-send answers as the first run did (the undo
# tombstone).
# KEYS[1] lock key, KEYS[2] index key, KEYS[3] the queue's key, KEYS[4] the undo tombstone
# ("{lock key}:undo")
# ARGV[1] owner, ARGV[2] request id, ARGV[3] the store's database, ARGV[4] the broker's,
# ARGV[5] the message, ARGV[6] tombstone ttl ms
# Returns 1 when the message was taken back (nothing of the dispatch is left), else 0.
UNFUSE = """
if redis.call('GET', KEYS[4]) == ARGV[1] .. '|' .. ARGV[2] then return 1 end
if ARGV[4] ~= ARGV[3] then redis.call('SELECT', ARGV[4]) end
local removed = redis.call('LREM', KEYS[3], 1, ARGV[5])
if ARGV[4] ~= ARGV[3] then redis.call('SELECT', ARGV[3]) end
if removed == 0 then return 0 end
local s = redis.call('HMGET', KEYS[1], 'owner', 'req')
if s[1] == ARGV[1] and s[2] == ARGV[2] then
  redis.call('DEL', KEYS[1])
  redis.call('ZREM', KEYS[2], KEYS[1])
end
redis.call('SET', KEYS[4], ARGV[1] .. '|' .. ARGV[2], 'PX', ARGV[6])
return 1
"""

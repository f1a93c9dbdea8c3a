"""Every Lua script of the Redis store, in one place.

A lock is a hash (owner, state, acquired, expires, task, id, run, took) with a PEXPIRE; the
index is a sorted set of lock keys scored by their expiry (ms), so held locks can be listed
and paginated without KEYS and stale entries trimmed by score. Times come from the Redis
server's own clock (TIME), so clients with skewed clocks agree.

Idempotent decisions (SPEC S7): a script re-sent after a lost reply answers as the first run
did and changes nothing more. ACQUIRE and DEBOUNCE know their request by the dispatch's task
id, START by the delivery's nonce (``run``), RELEASE by a request id it leaves in a short-lived
tombstone ("{lock key}:rel"), CLAIM by the message id it leaves in a claim record. The scripts
that write at dispatch (ACQUIRE, DEBOUNCE) also carry the time the caller gives up (a deadline
on the server's clock): run later than that (Redis was stalled, the reply came too late),
they change nothing and answer "late", since the caller has already raised StoreUnavailable.

On a Redis Cluster all keys of one script must share a slot: every key a script gets is the
lock (or state) key, that key plus a suffix, or an index shard, and the cluster store
(``cluster.py``) gives them one hash tag.
"""

import hashlib

from dedup_jobs.stores.redis.fused_scripts import DISPATCH_CLOCK
from dedup_jobs.stores.redis.trim import trim_lua
from dedup_jobs.stores.redis.undo_scripts import _taken_from_caller

#: Lua: drop up to INDEX_TRIM entries of expired locks from the index KEYS[2] (``now``: ms)
_trim_index = trim_lua("KEYS[2]", "now")


def _late(deadline: str) -> str:
    """Lua of the worker's checks (START, START_EXCLUSIVE), before their first write: read
    the server's clock into ``now`` and, past the caller's deadline ``deadline`` (an ARGV,
    ms on the server's clock, "0": none), answer {5, now} and change nothing. The caller
    has given up by then (W4 ran the body, W7 deferred it): what the check should have taken
    is taken by the re-send the reconciliation or the deferred copy sends, with a deadline of
    its own; a late check must not take a lock or a marker for a run that may have ended."""
    return f"""
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local deadline = tonumber({deadline}) or 0
if deadline > 0 and now > deadline then return {{5, now}} end
"""

# ACQUIRE — take a free lock (or refresh one the caller already holds, when reentrant).
# KEYS[1] lock key, KEYS[2] index key
# ARGV[1] owner, ARGV[2] ttl ms, ARGV[3] deadline ms (server clock; "0": none),
# ARGV[4] reentrant "1"/"0", ARGV[5] task name, ARGV[6] readable id, ARGV[7] the dispatch's
# request id (kept in 'req': a re-send of this very request is known by it, S7; "": none,
# a refresh keeps the one there)
# Returns "1" .. owner when taken (also to a re-send of the request that took it, even with
# an explicit task id), "0" .. holder when another owner holds it, or the caller's own id
# under another request (an earlier dispatch of the same explicit id), "L" .. server ms when
# run past the deadline (nothing changed): one bulk string, the cheapest reply to read. The
# server clock is read only once the lock is known to be free: a duplicate costs one HGET.
# Index entries of expired locks are trimmed here
# about one time in 16 (by the microseconds of TIME) and on every RELEASE: off the dispatch
# path, where each command inside the script is paid by the caller; at most INDEX_TRIM at a
# time, so a backlog of expired entries never stalls one call (benchmarks/growth.py).
ACQUIRE = """
local cur = redis.call('HGET', KEYS[1], 'owner')
local req = ARGV[7] or ''
if cur and (ARGV[4] ~= '1' or cur ~= ARGV[1]) then
  if cur == ARGV[1] and req ~= '' and redis.call('HGET', KEYS[1], 'req') == req then
    return '1' .. cur
  end
  return '0' .. cur
end
""" + DISPATCH_CLOCK + """
if req == '' and cur then req = redis.call('HGET', KEYS[1], 'req') or '' end
local expires = now + tonumber(ARGV[2])
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'state', 'queued', 'acquired', now,
           'expires', expires, 'task', ARGV[5], 'id', ARGV[6], 'req', req)
redis.call('PEXPIRE', KEYS[1], ARGV[2])
if tonumber(t[2]) % 16 == 0 then
""" + _trim_index + """
end
redis.call('ZADD', KEYS[2], expires, KEYS[1])
return '1' .. ARGV[1]
"""

# START — the worker-side check before run.
# KEYS[1] lock key, KEYS[2] index key, KEYS[3] release tombstone ("{lock key}:rel")
# ARGV[1] owner, ARGV[2] lease ms, ARGV[3] this delivery's nonce, ARGV[4] release "1"/"0",
# ARGV[5] task name, ARGV[6] readable id, ARGV[7] tombstone ttl ms, ARGV[8] redelivered "1"/"0",
# ARGV[9] deadline ms (server clock; "0": none)
# Returns {5, server ms} when run past the deadline, before any write (nothing changed, S7:
# the caller re-sends, _late); {0, holder} when another owner holds it (skip), {4, holder,
# ms since} when that owner took it over from the caller (R1) that many ms ago
# (_taken_from_caller); {2, 'live'} when the lock is the caller's and running under another
# delivery of the same message (W5: the first delivery lives, its lease keeps the lock);
# {3, 'done'} when the caller is a redelivered copy, the key
# is free and RELEASE's tombstone says the caller's own run just ended (W5: the copy is
# dropped; the result backend may not hold that run's result yet, Celery stores it after the
# body returns and the lock is released); otherwise runs and returns {1, 'released'} (release and
# the caller held it), {1, 'free'} (release, nothing held), {1, 'taken'} (was free, now
# running under the caller) or {1, 'held'} (caller's, now running). A re-send (same nonce)
# answers as the first: the nonce is kept in 'run' (and 'took'); a release's answer, "released"
# or "free", in the tombstone ("nonce|answer"), so a re-send after a new dispatch took the key
# is not skipped.
START = """
local cur = redis.call('HGET', KEYS[1], 'owner')
if ARGV[4] == '1' then
  local tomb = redis.call('GET', KEYS[3])
  if tomb == ARGV[3] .. '|released' then return {1, 'released'} end
  if tomb == ARGV[3] .. '|free' then return {1, 'free'} end
  if cur and cur ~= ARGV[1] then
""" + _taken_from_caller + """
    return {0, cur}
  end
""" + _late("ARGV[9]") + """
  if cur then
    redis.call('DEL', KEYS[1])
    redis.call('ZREM', KEYS[2], KEYS[1])
    redis.call('SET', KEYS[3], ARGV[3] .. '|released', 'PX', ARGV[7])
    return {1, 'released'}
  end
  redis.call('SET', KEYS[3], ARGV[3] .. '|free', 'PX', ARGV[7])
  return {1, 'free'}
end
if cur and cur ~= ARGV[1] then
""" + _taken_from_caller + """
  return {0, cur}
end
if not cur and ARGV[8] == '1' then
  local tomb = redis.call('GET', KEYS[3])
  if tomb then
    local bar = string.find(tomb, '|', 1, true)
    if bar and string.sub(tomb, bar + 1) == ARGV[1] then return {3, 'done'} end
  end
end
local took = not cur
if cur then
  local s = redis.call('HMGET', KEYS[1], 'state', 'run', 'took')
  if s[2] == ARGV[3] then
    took = s[3] == '1'
  elseif s[1] == 'running' and s[2] then
    return {2, 'live'}
  end
end
""" + _late("ARGV[9]") + """
local expires = now + tonumber(ARGV[2])
if not cur then
  redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'acquired', now, 'task', ARGV[5],
             'id', ARGV[6])
end
redis.call('HSET', KEYS[1], 'state', 'running', 'expires', expires, 'run', ARGV[3],
           'took', took and '1' or '0')
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('ZADD', KEYS[2], expires, KEYS[1])
if took then return {1, 'taken'} end
return {1, 'held'}
"""

# RELEASE — compare-and-delete by owner token (and trim up to INDEX_TRIM index entries of
# expired locks).
# KEYS[1] lock key, KEYS[2] index key, KEYS[3] release tombstone ("{lock key}:rel")
# ARGV[1] owner, ARGV[2] request id, ARGV[3] tombstone ttl ms
# Returns 1 when the caller's lock was deleted (also to a re-send of that request, by the
# tombstone "request id|owner", which START also reads for W5; and to the same owner's
# release made again as a new request, the worker's re-send, while the key is still free),
# 0 otherwise (free, or another owner's: a release whose owner lost the key to a newer one
# says so).
RELEASE = """
if redis.call('HGET', KEYS[1], 'owner') == ARGV[1] then
  redis.call('DEL', KEYS[1])
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
""" + _trim_index + """
  redis.call('ZREM', KEYS[2], KEYS[1])
  redis.call('SET', KEYS[3], ARGV[2] .. '|' .. ARGV[1], 'PX', ARGV[3])
  return 1
end
local tomb = redis.call('GET', KEYS[3])
if tomb == ARGV[2] .. '|' .. ARGV[1] then return 1 end
if tomb and redis.call('EXISTS', KEYS[1]) == 0 then
  local bar = string.find(tomb, '|', 1, true)
  if bar and string.sub(tomb, bar + 1) == ARGV[1] then return 1 end
end
return 0
"""

# RENEW — the lease of a running job: extend the caller's lock so it expires no sooner than
# now + ttl (never shortens it); take the key back for the caller when it is free (the lock
# was flushed, evicted or released under the running job, W6); never touch another owner's.
# KEYS[1] lock key, KEYS[2] index key
# ARGV[1] owner, ARGV[2] ttl ms, ARGV[3] the caller's deadline (epoch ms, server clock), ARGV[4]
# task name, ARGV[5] readable id, ARGV[6] the running delivery's nonce ("": unknown), kept in
# 'run' as START leaves it, so that W5 still tells a second delivery from this run
# Returns "1" when the caller held the lock (extended or already long enough; "C" .. owner
# instead when a dispatch of that owner asked this run to stop, L2, cancel_take), "2" when the
# key was free and the caller holds it again (state running, its index entry back), or
# "0" .. holder when another owner holds it. A re-send answers "1" and changes nothing more.
# S7: a take-back past the caller's deadline (a late renewal: the run may have ended and
# released since) changes nothing and answers "L" .. server time.
RENEW = """
local cur = redis.call('HGET', KEYS[1], 'owner')
if cur and cur ~= ARGV[1] then
  return '0' .. cur
end
local ttl = tonumber(ARGV[2])
local held = '1'
if cur then
  local c = redis.call('HGET', KEYS[1], 'cancel')
  if c then held = 'C' .. c end
  if redis.call('PTTL', KEYS[1]) >= ttl then return held end
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local expires = now + ttl
if cur then
  redis.call('HSET', KEYS[1], 'expires', expires)
else
  if now > tonumber(ARGV[3]) then return 'L' .. now end
  redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'state', 'running', 'acquired', now,
             'expires', expires, 'task', ARGV[4], 'id', ARGV[5])
  if ARGV[6] ~= '' then redis.call('HSET', KEYS[1], 'run', ARGV[6], 'took', '0') end
end
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('ZADD', KEYS[2], expires, KEYS[1])
if cur then return held end
return '2'
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

# TAKE_OVER — R1 (on_duplicate = "replace"): take a free lock, or take a queued one over.
# KEYS[1] lock key, KEYS[2] index key
# ARGV[1] owner, ARGV[2] ttl ms, ARGV[3] deadline ms (server clock; "0": none),
# ARGV[4] task name, ARGV[5] readable id, ARGV[6] the dispatch's request id (kept in 'req')
# Returns "1" when taken (it was free), "R" .. replaced owner when it was held queued by
# another owner (the lock is the caller's now; the replaced id is kept in 'replaced', and
# with its request id and its own chain in 'chain' (undo_scripts.py), so that UNDO can give
# it back and START can tell the replaced message, S7), "0" .. holder
# when held running, or held by the caller's own id under another request (nothing
# changed), "L" .. server ms when run past the deadline (nothing changed). A re-send of the
# same request (without a request id: by the same owner) answers as the first did: "R" .. the
# id it replaced, or "1".
# L2 (cancel_take): with KEYS[3], the key's running marker ("{lock key}:run"), the answer is
# {that answer, cancelled}: when the lock was taken, a marker held by another owner is asked
# to stop (its 'cancel' set to the caller, read back by RENEW) and cancelled names that
# owner ("" when there is none, or another dispatch had asked it already; a re-send of the
# caller's names it again).
TAKE_OVER = """
local function no(a)
  if KEYS[3] then return {a, ''} end
  return a
end
local function done(a)
  if not KEYS[3] then return a end
  local m = redis.call('HMGET', KEYS[3], 'owner', 'cancel')
  if not m[1] or m[1] == ARGV[1] then return {a, ''} end
  if m[2] == ARGV[1] then return {a, m[1]} end
  redis.call('HSET', KEYS[3], 'cancel', ARGV[1])
  if m[2] then return {a, ''} end
  return {a, m[1]}
end
local s = redis.call('HMGET', KEYS[1], 'owner', 'state', 'replaced', 'req', 'chain')
local cur = s[1]
local req = ARGV[6] or ''
if cur == ARGV[1] then
  if req ~= '' and s[4] ~= req then return no('0' .. cur) end
  if s[3] and s[3] ~= '' then return done('R' .. s[3]) end
  return done('1')
end
if cur and s[2] == 'running' then
  return no('0' .. cur)
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local deadline = tonumber(ARGV[3])
if deadline > 0 and now > deadline then
  return no('L' .. now)
end
local expires = now + tonumber(ARGV[2])
local chain = ''
if cur then
  local older = {}
  if s[5] and s[5] ~= '' then older = cjson.decode(s[5]) end
  while #older >= 16 do table.remove(older) end
  table.insert(older, 1, {cur, s[4] or ''})
  chain = cjson.encode(older)
end
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'state', 'queued', 'acquired', now,
           'expires', expires, 'task', ARGV[4], 'id', ARGV[5], 'replaced', cur or '',
           'req', req, 'chain', chain)
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('ZADD', KEYS[2], expires, KEYS[1])
if cur then return done('R' .. cur) end
return done('1')
"""

# START_EXCLUSIVE — R2: the until-processing worker check of a job without_overlapping.
# KEYS[1] lock key, KEYS[2] index key, KEYS[3] running marker ("{lock key}:run")
# ARGV[1] owner, ARGV[2] lease ms, ARGV[3] this delivery's nonce, ARGV[4] task name,
# ARGV[5] readable id, ARGV[6] deadline ms (server clock; "0": none)
# Returns {5, server ms} when run past the deadline, before any write (nothing changed, S7:
# the deferred copy re-sends it, _late), {0, holder} when another owner holds the lock
# (skip), {4, holder, ms since} when it took the lock over from the caller (as START);
# {3, running owner} when
# another run of the key is in progress (the caller waits; its lock is left as it is);
# {2, 'live'} when the marker is the caller's under another delivery (W5); otherwise
# deletes the caller's lock, takes the marker (a hash like a lock, state running, indexed,
# renewed by RENEW and released by RELEASE) and returns {1, 'released'} or {1, 'free'}. A
# re-send (same nonce, kept in the marker's 'run') answers as the first did.
START_EXCLUSIVE = """
local m = redis.call('HMGET', KEYS[3], 'owner', 'run', 'ans')
if m[1] == ARGV[1] and m[2] == ARGV[3] then return {1, m[3]} end
local cur = redis.call('HGET', KEYS[1], 'owner')
if cur and cur ~= ARGV[1] then
""" + _taken_from_caller + """
  return {0, cur}
end
if m[1] then
  if m[1] == ARGV[1] then return {2, 'live'} end
  return {3, m[1]}
end
""" + _late("ARGV[6]") + """
local expires = now + tonumber(ARGV[2])
local ans = 'free'
if cur then
  redis.call('DEL', KEYS[1])
  redis.call('ZREM', KEYS[2], KEYS[1])
  ans = 'released'
end
redis.call('HSET', KEYS[3], 'owner', ARGV[1], 'state', 'running', 'acquired', now,
           'expires', expires, 'task', ARGV[4], 'id', ARGV[5], 'run', ARGV[3], 'took', '1',
           'ans', ans)
redis.call('PEXPIRE', KEYS[3], ARGV[2])
redis.call('ZADD', KEYS[2], expires, KEYS[3])
return {1, ans}
"""

# DEBOUNCE, CLAIM, WITHDRAW — debounce (D1-D9), in a module of their own (their keys,
# arguments and answers are stated there).
from dedup_jobs.stores.redis.debounce_scripts import (  # noqa: E402, F401
    CLAIM,
    DEBOUNCE,
    WITHDRAW,
)

#: expired index entries one TRIM_INDEX drops
TRIM_BATCH = 1000

# TRIM_INDEX — clear_stale_locks' trim of the lock index (an operator's command, not a
# decision): up to TRIM_BATCH entries of locks expired on the server's clock.
# KEYS[1] an index (shard). Returns how many it dropped (fewer than TRIM_BATCH: the last call).
TRIM_INDEX = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
""" + trim_lua("KEYS[1]", "now", TRIM_BATCH) + """
return trimmed
"""

# THROTTLE_ADMIT, THROTTLE_RELEASE, THROTTLE_RENEW — throttling (T2-T4), in a module of
# their own (their keys, arguments and answers are stated there); UNDO — the undo of a failed
# dispatch (S7), beside the fragment _taken_from_caller of START and START_EXCLUSIVE.
# FUSED, UNFUSE — the fused dispatch (a lock and its message in one script), in a module of
# its own (fused_scripts.py).
from dedup_jobs.stores.redis.fused_scripts import FUSED, UNFUSE  # noqa: E402, F401
from dedup_jobs.stores.redis.throttle_scripts import (  # noqa: E402, F401
    THROTTLE_ADMIT,
    THROTTLE_RELEASE,
    THROTTLE_RENEW,
)
from dedup_jobs.stores.redis.undo_scripts import UNDO  # noqa: E402, F401

#: SHA1 of every script above, for EVALSHA (computed once, at import)
SHA = {
    name: hashlib.sha1(body.encode("utf-8")).hexdigest()
    for name, body in dict(globals()).items()
    if name.isupper() and isinstance(body, str) and "redis.call" in body
}

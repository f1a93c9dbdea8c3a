"""The Lua scripts of debounce (SPEC section 4, D1-D9, and S7's undo), imported into
``scripts.py`` (where every script of the Redis store is listed and hashed for EVALSHA)."""

from dedup_jobs.stores.redis.trim import trim_lua

# A pending debounce is a hash (message, latest, payload, previous (the payload before the
# latest's, for WITHDRAW), first, last, run_at, deadline, count, task, id, base (ids adopted
# from a stale burst)) beside a hash of every dispatch id of the burst ("{state key}:seen":
# id -> "n|the id it superseded", so a re-sent dispatch is known in O(1) and CLAIM can order
# the ids); the index "{KEY_PREFIX}:index:debounce" is a sorted set of state keys scored by
# when they are due (ms). A claimed burst leaves a claim record of its message for a while:
# the state and its ids renamed to "{state key}:claim:{message id}" (and ":seen"), so that
# a re-sent CLAIM answers as the first did; and the key's record of its latest claim
# ("{state key}:claimed": the message; ":claimed:seen": a copy of its ids), so that a
# re-sent DEBOUNCE of an id that already ran does too.

# DEBOUNCE — one dispatch: start a burst, or absorb the dispatch into the pending one.
# KEYS[1] state hash, KEYS[2] seen hash, KEYS[3] debounce index, KEYS[4] claim record,
# KEYS[5] claim record's seen hash
# ARGV[1] task id, ARGV[2] payload (latest args), ARGV[3] now ms, ARGV[4] debounce_for ms,
# ARGV[5] max_wait ms or "" (none), ARGV[6] ttl ms (how long the state outlives its due time),
# ARGV[7] task name, ARGV[8] readable id, ARGV[9] deadline ms (server clock; "0": none),
# ARGV[10] grace ms: a burst whose due time passed more than this long ago without a claim is
# stale (its message is taken as lost): the dispatch starts a new burst that adopts the stale
# one's ids (its run records its outcome under them; "base" counts them), so a burst never
# absorbs dispatches past its due time plus the grace.
# Returns {1, task id, ""} when it started a burst (the caller publishes its message),
# {0, message id, superseded id} when it was absorbed, {2, server ms, ""} when run past the
# deadline (nothing changed). Every command inside the script is paid by the caller, so the
# state is read in one HMGET and written in one HSET (the count and the previous payload
# come from the read), and index entries of bursts gone for ``ttl`` are trimmed about one
# dispatch in 16 (by the microseconds of TIME), at most INDEX_TRIM of them (trim.py); a
# claim takes its own entry out.
DEBOUNCE = """
local cur = redis.call('HMGET', KEYS[1], 'message', 'latest', 'deadline', 'run_at', 'base',
                       'payload', 'count')
local msg = cur[1]
local seen = msg and redis.call('HGET', KEYS[2], ARGV[1])
if seen then
  if msg == ARGV[1] then return {1, msg, ''} end
  return {0, msg, string.sub(seen, string.find(seen, '|', 1, true) + 1)}
end
if redis.call('HEXISTS', KEYS[5], ARGV[1]) == 1 then
  return {0, redis.call('HGET', KEYS[4], 'message'), ''}
end
local t = redis.call('TIME')
local deadline = tonumber(ARGV[9])
if deadline > 0 then
  local server = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  if server > deadline then return {2, server, ''} end
end
local now = tonumber(ARGV[3])
local run_at = now + tonumber(ARGV[4])
local ttl = tonumber(ARGV[6])
local prev = false
local deadline_at
local count = 1
local base = 0
if msg then
  deadline_at = tonumber(cur[3])
  local was_due = tonumber(cur[4])
  if deadline_at and deadline_at < was_due then was_due = deadline_at end
  if was_due + tonumber(ARGV[10]) < now then
    msg = false
    base = redis.call('HLEN', KEYS[2])
  else
    prev = cur[2]
    base = tonumber(cur[5]) or 0
  end
end
if msg then
  count = (tonumber(cur[7]) or 0) + 1
  redis.call('HSET', KEYS[1], 'latest', ARGV[1], 'payload', ARGV[2], 'last', now,
             'run_at', run_at, 'previous', cur[6] or '', 'count', count)
else
  msg = ARGV[1]
  deadline_at = nil
  if base == 0 then redis.call('DEL', KEYS[2]) end
  if ARGV[5] ~= '' then deadline_at = now + tonumber(ARGV[5]) end
  redis.call('HSET', KEYS[1], 'message', msg, 'latest', msg, 'payload', ARGV[2],
             'first', now, 'last', now, 'run_at', run_at, 'deadline', deadline_at or '',
             'count', 1, 'task', ARGV[7], 'id', ARGV[8], 'base', base)
end
redis.call('HSET', KEYS[2], ARGV[1], (base + count) .. '|' .. (prev or ''))
local due = run_at
if deadline_at and deadline_at < due then due = deadline_at end
redis.call('PEXPIRE', KEYS[1], due - now + ttl)
redis.call('PEXPIRE', KEYS[2], due - now + ttl)
if tonumber(t[2]) % 16 == 0 then
""" + trim_lua("KEYS[3]", "now - ttl") + """
end
redis.call('ZADD', KEYS[3], due, KEYS[1])
if prev then return {0, msg, prev} end
return {1, msg, ''}
"""

# CLAIM — the burst's message is at the worker: claim the burst if it is due.
# KEYS[1] state hash, KEYS[2] seen hash, KEYS[3] debounce index, KEYS[4] the key's claim
# record (its latest claim), KEYS[5] that record's seen hash, KEYS[6] this message's claim
# record ("{state key}:claim:{message id}"), KEYS[7] its seen hash
# ARGV[1] message id, ARGV[2] now ms, ARGV[3] tolerance ms (a timer firing this early is due),
# ARGV[4] ms the claim record is kept
# Returns {"missing"}, {"other", message id}, {"adopted"} (the message of a stale burst whose
# ids a newer burst adopted: that burst's run answers for it), {"wait", due ms}, or
# {"claimed", latest id, payload, {id, "n|superseded", ...}} after moving the state into the
# message's claim record (a later dispatch starts a new burst). A re-sent CLAIM of the same
# message gets the same answer from its own record, also after a later burst of the key was
# claimed (S7: the record is the message's, not the key's). The key's record (a copy of the
# latest claim's ids) lets DEBOUNCE tell a re-sent dispatch of a burst that already ran.
CLAIM = """
local s = redis.call('HMGET', KEYS[1], 'message', 'run_at', 'deadline')
if s[1] ~= ARGV[1] then
  local c = redis.call('HMGET', KEYS[6], 'message', 'latest', 'payload')
  if c[1] == ARGV[1] then
    return {'claimed', c[2], c[3], redis.call('HGETALL', KEYS[7])}
  end
  if redis.call('HEXISTS', KEYS[2], ARGV[1]) == 1 or
     redis.call('HEXISTS', KEYS[5], ARGV[1]) == 1 then
    return {'adopted'}
  end
  if not s[1] then return {'missing'} end
  return {'other', s[1]}
end
local due = tonumber(s[2])
local deadline = tonumber(s[3])
if deadline and deadline < due then due = deadline end
if due - tonumber(ARGV[2]) > tonumber(ARGV[3]) then return {'wait', due} end
redis.call('RENAME', KEYS[1], KEYS[6])
redis.call('DEL', KEYS[4], KEYS[5])
if redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('RENAME', KEYS[2], KEYS[7])
  redis.call('COPY', KEYS[7], KEYS[5])
  redis.call('PEXPIRE', KEYS[7], ARGV[4])
  redis.call('PEXPIRE', KEYS[5], ARGV[4])
else
  redis.call('DEL', KEYS[7])
end
redis.call('HSET', KEYS[4], 'message', ARGV[1])
redis.call('PEXPIRE', KEYS[4], ARGV[4])
redis.call('PEXPIRE', KEYS[6], ARGV[4])
redis.call('ZREM', KEYS[3], KEYS[1])
local v = redis.call('HMGET', KEYS[6], 'latest', 'payload')
return {'claimed', v[1], v[2], redis.call('HGETALL', KEYS[7])}
"""

# WITHDRAW — the undo of a dispatch that raised StoreUnavailable although its DEBOUNCE ran
# and absorbed it (a lost reply): the burst forgets it, and if it was the latest, the previous
# latest's arguments are the burst's again (S7: a failed dispatch never supplies the arguments).
# KEYS as DEBOUNCE. ARGV[1] task id. Returns 1 when it took the dispatch out, 0 when the burst
# does not hold it as an absorbed dispatch (gone, claimed, or the burst's own message).
WITHDRAW = """
local seen = redis.call('HGET', KEYS[2], ARGV[1])
if not seen then return 0 end
local s = redis.call('HMGET', KEYS[1], 'message', 'latest', 'previous')
if not s[1] or s[1] == ARGV[1] then return 0 end
redis.call('HDEL', KEYS[2], ARGV[1])
if s[2] == ARGV[1] and s[3] then
  local prev = string.sub(seen, string.find(seen, '|', 1, true) + 1)
  redis.call('HSET', KEYS[1], 'latest', prev, 'payload', s[3])
end
return 1
"""

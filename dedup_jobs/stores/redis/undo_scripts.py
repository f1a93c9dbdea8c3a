"""The Lua of S7's dispatch-side fates (a dispatch whose reply was lost or late): the undo of
a failed dispatch, and the fragment of the worker's start checks that tells a message whose
lock a take-over holds. Imported by ``scripts.py``, which computes every script's SHA1."""

# Inside START and START_EXCLUSIVE, where the lock KEYS[1] is held by ``cur``, another owner
# than the caller ARGV[1]: if ``cur`` took it over from the caller (R1), directly or through a
# chain of take-overs, answer {4, cur, ms since the take-over}. The dispatch that took it over
# may have failed (its reply lost, S7): until it has marked the caller REVOKED or its UNDO has
# given the lock back, the caller is not skipped but waits (engine/takeover.py). Read only on the
# skip path.
_taken_from_caller = """
local r = redis.call('HMGET', KEYS[1], 'chain', 'acquired')
if r[1] and r[1] ~= '' then
  for _, e in ipairs(cjson.decode(r[1])) do
    if e[1] == ARGV[1] then
      local t = redis.call('TIME')
      return {4, cur, tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
              - tonumber(r[2])}
    end
  end
end
"""

# A take-over keeps the queued holders it replaced, newest first, in the lock's 'chain' (a
# JSON list of [owner, request id]; 'replaced' names the first): TAKE_OVER pushes the holder it
# replaces (with that holder's own chain behind it, the 16 newest: a replace storm stays
# cheap; an undo past them deletes the lock, as one without a chain does), UNDO pops or
# splices.

# UNDO — S7: the undo of a dispatch that failed with StoreUnavailable (engine/rollback.py):
# only the lock that very request took (owner and request id), so an earlier dispatch of the
# same explicit task id keeps its lock. A lock taken over from a queued holder is given back
# to it (the holder still runs, R1), with its own request id and chain; a plain one is
# deleted. A lock already running is left. A request that a later take-over replaced in turn
# is dropped from the lock's chain, so no later undo gives the key back to a dispatch that
# failed (chained take-overs).
# KEYS[1] lock key, KEYS[2] index key, KEYS[3] its undo tombstone ("{lock key}:undo")
# KEYS[4] (undo_cancel, L2) the key's running marker: the request to stop that the caller left
# on it is withdrawn
# ARGV[1] owner, ARGV[2] request id ("": a lock taken without one, by owner alone),
# ARGV[3] tombstone ttl ms
# Returns 1 when the request's lock was undone (also to a re-send, by the tombstone), else 0.
UNDO = """
if KEYS[4] and redis.call('HGET', KEYS[4], 'cancel') == ARGV[1] then
  redis.call('HDEL', KEYS[4], 'cancel')
end
local s = redis.call('HMGET', KEYS[1], 'owner', 'req', 'chain', 'state')
local chain = {}
if s[3] and s[3] ~= '' then chain = cjson.decode(s[3]) end
local function keep(rest)
  if #rest == 0 then
    redis.call('HSET', KEYS[1], 'replaced', '', 'chain', '')
  else
    redis.call('HSET', KEYS[1], 'replaced', rest[1][1], 'chain', cjson.encode(rest))
  end
end
local undone = false
if s[1] == ARGV[1] and (s[2] or '') == ARGV[2] and s[4] ~= 'running' then
  if #chain > 0 then
    local back = table.remove(chain, 1)
    redis.call('HSET', KEYS[1], 'owner', back[1], 'req', back[2])
    keep(chain)
  else
    redis.call('DEL', KEYS[1])
    redis.call('ZREM', KEYS[2], KEYS[1])
  end
  undone = true
elseif s[1] then
  for i, e in ipairs(chain) do
    if e[1] == ARGV[1] and e[2] == ARGV[2] then
      table.remove(chain, i)
      keep(chain)
      undone = true
      break
    end
  end
end
if undone then
  redis.call('SET', KEYS[3], ARGV[1] .. '|' .. ARGV[2], 'PX', ARGV[3])
  return 1
end
if redis.call('GET', KEYS[3]) == ARGV[1] .. '|' .. ARGV[2] then return 1 end
return 0
"""

"""The Lua scripts of throttling (SPEC section 10, T2-T4), imported into ``scripts.py`` (where
every script of the Redis store is listed and hashed for EVALSHA).

A throttle key ``K`` (``{KEY_PREFIX}:throttle:{task}:{id}``, through the cache's key function)
is five keys sharing its hash tag (suffixes, so they share a slot on a Redis Cluster):

- ``K``         hash: task, id, limit (text, for the admin), n, k, p, avg (EWMA of run
                durations, ms), "s:"..owner (start of each slot, ms)
- ``K:slots``   sorted set: concurrency slots, member = owner task id, score = lease expiry
- ``K:wait``    sorted set: messages deferred for a slot, score = when they come back
- ``K:starts``  sorted set: starts of the last period, member = delivery nonce, score = when
- ``K:res``     sorted set: start times reserved for deferred messages, member = task id

The rate is a sliding window log (starts and reservations): every start checks that fewer
than ``k`` started in the period before it, so no window of one period ever holds more than
``k`` starts; a deferred message reserves the earliest start that keeps it so behind every
reservation made before it (and one period / k after the latest of them: paced, not in
bursts), and comes back for it. Times are the server's clock (TIME).
"""

# THROTTLE_ADMIT — T2/T3: admit a message to run, or defer it.
# KEYS[1] hash, KEYS[2] slots, KEYS[3] wait, KEYS[4] starts, KEYS[5] reservations,
# KEYS[6] throttle index (sorted set of hashes, scored by expiry)
# ARGV[1] owner (task id), ARGV[2] delivery nonce, ARGV[3] concurrency (0: none),
# ARGV[4] lease ms, ARGV[5] starts per period (0: none), ARGV[6] period ms, ARGV[7] task name,
# ARGV[8] readable id, ARGV[9] deadline ms (server clock; "0": none), ARGV[10] longest wait
# for a slot ms, ARGV[11] grace ms (a waiter late by more loses its turn), ARGV[12] limit
# text, ARGV[13] the shortest run duration assumed before one was measured ms, ARGV[14]
# margin ms, ARGV[15] a random fraction in [0, 1): the jitter of a wait for a slot (up to a
# quarter of the wait, at most 1 s), part of the waiter's turn so they come back in turn
# Returns {1, now} admitted (a slot taken or kept, the start recorded), {0, "concurrency" |
# "throttle", until ms, now} deferred, {2, now} run past the deadline (nothing changed). A
# re-send answers as the first: the start is known by its nonce, the slot by its owner, a
# reservation or a wait by the owner.
THROTTLE_ADMIT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local deadline = tonumber(ARGV[9])
if deadline > 0 and now > deadline then return {2, now} end
local owner = ARGV[1]
local n, lease = tonumber(ARGV[3]), tonumber(ARGV[4])
local k, p = tonumber(ARGV[5]), tonumber(ARGV[6])
local cap, grace, margin = tonumber(ARGV[10]), tonumber(ARGV[11]), tonumber(ARGV[14])
local ttl = math.max(lease, p) + cap + 2 * grace
local function keep()
  redis.call('HSET', KEYS[1], 'task', ARGV[7], 'id', ARGV[8], 'limit', ARGV[12], 'n', n,
             'k', k, 'p', p)
  for i = 1, 5 do redis.call('PEXPIRE', KEYS[i], ttl) end
  if tonumber(t[2]) % 16 == 0 then
    redis.call('ZREMRANGEBYSCORE', KEYS[6], '-inf', '(' .. now)
  end
  redis.call('ZADD', KEYS[6], now + ttl, KEYS[1])
end
if k > 0 and redis.call('ZSCORE', KEYS[4], ARGV[2]) then return {1, now} end
local holds = false
if n > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', '(' .. (now - lease))
  holds = redis.call('ZSCORE', KEYS[2], owner) ~= false
  if not holds then
    local mine = redis.call('ZSCORE', KEYS[3], owner)
    local ahead
    if mine then
      ahead = redis.call('ZCOUNT', KEYS[3], now - grace, '(' .. mine)
    else
      ahead = redis.call('ZCOUNT', KEYS[3], now - grace, now)
    end
    if redis.call('ZCARD', KEYS[2]) + ahead >= n then
      local pos
      if mine then
        pos = redis.call('ZCOUNT', KEYS[3], '-inf', '(' .. mine) + 1
      else
        pos = redis.call('ZCARD', KEYS[3]) + 1
      end
      local avg = tonumber(redis.call('HGET', KEYS[1], 'avg'))
      if not avg then
        -- no run measured yet: expect the running ones to last as long again as the
        -- oldest has so far (at least the assumed minimum)
        avg = tonumber(ARGV[13])
        for _, m in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
          local s = tonumber(redis.call('HGET', KEYS[1], 's:' .. m))
          if s and now - s > avg then avg = now - s end
        end
      end
      -- rounds of runs, each a little longer than the average run (a waiter that comes
      -- back too early costs a deferral more; one that comes late only leaves its slot,
      -- handed over to it at a release, idle for a moment)
      local turn = math.ceil(pos / n) * (avg * 1.2 + 10)
      local wait = math.min(cap, math.max(margin, turn))
      wait = wait + math.floor(tonumber(ARGV[15]) * math.min(1000, 10 + wait / 10))
      redis.call('ZADD', KEYS[3], now + wait, owner)
      redis.call('ZREM', KEYS[5], owner)
      keep()
      return {0, 'concurrency', now + wait, now}
    end
  end
end
if k > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now - p)
  redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', '(' .. (now - p - grace))
  local r = tonumber(redis.call('ZSCORE', KEYS[5], owner))
  if r and r > now + margin / 2 then
    redis.call('ZREM', KEYS[3], owner)
    keep()
    return {0, 'throttle', r, now}
  end
  local count = redis.call('ZCOUNT', KEYS[4], '(' .. (now - p), '+inf')
  local at = now
  if not (r and count < k) then
    -- a newcomer, or a reserved message whose start is taken after all (starts drifted
    -- later than their reservations): reserve behind every reservation made so far
    if r then redis.call('ZREM', KEYS[5], owner) end
    local a = redis.call('ZREVRANGE', KEYS[4], 0, k - 1, 'WITHSCORES')
    local b = redis.call('ZREVRANGE', KEYS[5], 0, k - 1, 'WITHSCORES')
    local i, j, seen, kth, latest = 2, 2, 0, nil, nil
    while seen < k and (i <= #a or j <= #b) do
      local x, y = tonumber(a[i]), tonumber(b[j])
      if y == nil or (x ~= nil and x >= y) then kth = x; i = i + 2 else kth = y; j = j + 2 end
      latest = latest or kth
      seen = seen + 1
    end
    -- the window's rule, and one period / k after the latest start or reservation, so that
    -- reserved starts come back one by one rather than k at the same instant
    if seen >= k then at = math.max(now, kth + p + margin, latest + math.floor(p / k)) end
  end
  if at > now then
    redis.call('ZADD', KEYS[5], at, owner)
    redis.call('ZREM', KEYS[3], owner)
    keep()
    return {0, 'throttle', at, now}
  end
  redis.call('ZREM', KEYS[5], owner)
  redis.call('ZADD', KEYS[4], now, ARGV[2])
end
if n > 0 then
  if not holds then redis.call('HSET', KEYS[1], 's:' .. owner, now) end
  redis.call('ZADD', KEYS[2], now + lease, owner)
  redis.call('ZREM', KEYS[3], owner)
end
keep()
return {1, now}
"""

# THROTTLE_RELEASE — free the caller's concurrency slot at the end of its run (T4: one round
# trip), fold the run's duration into the average run ('avg') the waiters' turns are made
# of, and hand the slot over to the waiter whose turn comes first (not one that is more than
# the grace late: it lost its turn): the slot is held for it until its turn + grace, so it is
# admitted when it comes back, whatever else arrives meanwhile.
# KEYS[1] hash, KEYS[2] slots, KEYS[3] wait; ARGV[1] owner, ARGV[2] grace ms
# Returns 1 when the caller's slot was freed, 0 when it held none (gone, or a re-send).
THROTTLE_RELEASE = """
if redis.call('ZREM', KEYS[2], ARGV[1]) == 0 then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local started = tonumber(redis.call('HGET', KEYS[1], 's:' .. ARGV[1]))
if started then
  local took = math.max(1, now - started)
  local avg = tonumber(redis.call('HGET', KEYS[1], 'avg'))
  if avg then took = math.floor(avg * 0.7 + took * 0.3) end
  redis.call('HSET', KEYS[1], 'avg', took)
  redis.call('HDEL', KEYS[1], 's:' .. ARGV[1])
end
local grace = tonumber(ARGV[2])
local next = redis.call('ZRANGEBYSCORE', KEYS[3], now - grace, '+inf', 'WITHSCORES',
                        'LIMIT', 0, 1)
if next[1] then
  local due = math.max(now, tonumber(next[2]))
  redis.call('ZREM', KEYS[3], next[1])
  redis.call('ZADD', KEYS[2], due + grace, next[1])
  redis.call('HSET', KEYS[1], 's:' .. next[1], due)
end
return 1
"""

# THROTTLE_RENEW — the lease of a running job's concurrency slot (as RENEW for a lock).
# KEYS[1] hash, KEYS[2] slots; ARGV[1] owner, ARGV[2] ttl ms, ARGV[3] concurrency
# Returns "1" when the caller's slot was extended, "2" when it had lapsed and was free to take
# back, "0" when it had lapsed and every slot is taken (nothing changed).
THROTTLE_RENEW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
local answer = '1'
if not redis.call('ZSCORE', KEYS[2], ARGV[1]) then
  if redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[3]) then return '0' end
  answer = '2'
end
redis.call('ZADD', KEYS[2], 'GT', now + ttl, ARGV[1])
for i = 1, 2 do
  if redis.call('PTTL', KEYS[i]) < ttl then redis.call('PEXPIRE', KEYS[i], ttl) end
end
return answer
"""

"""The Lua scripts of throttling (SPEC section 10, T2-T4), imported into ``scripts.py`` (where
every script of the Redis store is listed and hashed for EVALSHA).

A throttle key ``K`` (``{KEY_PREFIX}:throttle:{task}:{id}``, through the cache's key function)
is five keys sharing its hash tag (suffixes, so they share a slot on a Redis Cluster):

- ``K``         hash: task, id, limit (text, for the admin), n, k, p, avg (EWMA of run
                durations, ms), "s:"..owner (start of each slot, ms)
- ``K:slots``   sorted set: concurrency slots, member = owner task id, score = lease expiry
- ``K:wait``    sorted set: messages deferred for a slot, score = their planned turn
- ``K:starts``  sorted set: starts of the last period, member = delivery nonce, score = when
- ``K:res``     sorted set: start times reserved for deferred messages, member = task id
- ``K:done``    sorted set: tombstones of released slots (issue 21's fates), score = expiry:
                "n:"..nonce (a grant released, or superseded by a later admission of its task:
                a re-sent or late admission with that nonce changes nothing) and "o:"..owner
                (a slot its owner released: a re-sent release answers as the first, a late
                renewal never takes it back). The hash's "g:"..owner is the nonce of the
                admission holding owner's slot, "l" the lease (ms).

The rate is a sliding window log (starts and reservations): every start checks that fewer
than ``k`` started in the period before it, so no window of one period ever holds more than
``k`` starts; a deferred message reserves the earliest start that keeps it so behind every
reservation made before it (and one period / k after the latest of them: paced, not in
bursts), and comes back for it. Times are the server's clock (TIME).
"""

from dedup_jobs.stores.redis.trim import trim_lua

# THROTTLE_ADMIT — T2/T3: admit a message to run, or defer it.
# KEYS[1] hash, KEYS[2] slots, KEYS[3] wait, KEYS[4] starts, KEYS[5] reservations,
# KEYS[6] tombstones, KEYS[7] throttle index (sorted set of hashes, scored by expiry)
# ARGV[1] owner (task id), ARGV[2] delivery nonce, ARGV[3] concurrency (0: none),
# ARGV[4] lease ms, ARGV[5] starts per period (0: none), ARGV[6] period ms, ARGV[7] task name,
# ARGV[8] readable id, ARGV[9] deadline ms (server clock; "0": none), ARGV[10] longest wait
# for a slot ms, ARGV[11] grace ms (a reservation late by more is dropped), ARGV[12] limit
# text, ARGV[13] the shortest run duration assumed before one was measured ms, ARGV[14]
# margin ms, ARGV[15] a random fraction in [0, 1): the jitter of a turn (up to a tenth of a
# step + 10 ms, at most 1 s), part of the waiter's turn, ARGV[16] the turn factor and
# ARGV[17] the turn pad ms (a step, the time a slot is planned for per run, is the average
# run x the factor + the pad), ARGV[18] the held-back factor (see below), ARGV[19] the wake's
# stretch (0: the caller's front-end cannot be woken; else a waiter's turn is planned this
# many steps after the one it follows, where that puts it more than ARGV[20], the wake's
# threshold ms, later: the release that frees its slot calls it, THROTTLE_RELEASE)
# Concurrency: the waiters' turns are a plan of N lanes (one per slot): a waiter's turn is
# one step after the N-th latest planned start (running slots' starts, other waiters'
# turns); a waiter back for its turn takes any free slot; a newcomer takes a free slot only
# if no planned turn needs it. While a waiter misses its turn (not back a step after it:
# the broker holds it behind newer messages), its slot would idle: a newcomer takes any
# free slot, and a message deferred meanwhile is planned at least the held-back factor x
# that waiter's lateness from now (at most a quarter of the longest wait), to come back
# after the burst.
# Returns {1, now} admitted (a slot taken or kept, the start recorded; {1, now, 1}: the slot
# was its owner's already, a retry's or another live delivery's, W5), {0, "concurrency" |
# "throttle", until ms, now} deferred, {2, now} run past the deadline (nothing changed), {3,
# now} the grant of this nonce was released or superseded already (nothing changed). A
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
             'k', k, 'p', p, 'l', lease)
  for i = 1, 6 do redis.call('PEXPIRE', KEYS[i], ttl) end
  if tonumber(t[2]) % 16 == 0 then
""" + trim_lua("KEYS[7]", "now") + """
  end
  redis.call('ZADD', KEYS[7], now + ttl, KEYS[1])
end
if n > 0 then
  -- a grant released (or superseded), sent again or late: changes nothing
  redis.call('ZREMRANGEBYSCORE', KEYS[6], '-inf', now)
  if redis.call('ZSCORE', KEYS[6], 'n:' .. ARGV[2]) then return {3, now} end
end
if k > 0 and redis.call('ZSCORE', KEYS[4], ARGV[2]) then return {1, now} end
local holds = false
if n > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', '(' .. (now - lease))
  holds = redis.call('ZSCORE', KEYS[2], owner) ~= false
  if not holds then
    local mine = tonumber(redis.call('ZSCORE', KEYS[3], owner))
    local slots = redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')
    local free = #slots / 2 < n
    -- the planned starts: each running slot's start, each waiter's turn (but the caller's)
    local planned, oldest = {}, tonumber(ARGV[13])
    for i = 1, #slots, 2 do
      local s = tonumber(redis.call('HGET', KEYS[1], 's:' .. slots[i]))
      s = s or (tonumber(slots[i + 1]) - lease)
      planned[#planned + 1] = s
      if now - s > oldest then oldest = now - s end
    end
    -- no run measured yet: expect the running ones to last as long again as the oldest
    -- has so far (at least the assumed minimum)
    local avg = tonumber(redis.call('HGET', KEYS[1], 'avg')) or oldest
    -- a step, the time a slot is planned for per run: the average run, made longer on
    -- purpose (a waiter back while every slot is still taken costs a deferral more; one
    -- back late only leaves a slot idle for a moment)
    local step = math.ceil(avg * tonumber(ARGV[16]) + tonumber(ARGV[17]))
    local w = redis.call('ZREVRANGE', KEYS[3], 0, n, 'WITHSCORES')
    for i = 1, #w, 2 do
      if w[i] ~= owner then planned[#planned + 1] = tonumber(w[i + 1]) end
    end
    table.sort(planned, function(x, y) return x > y end)
    -- N lanes, one per slot: the earliest a slot is planned free is one step after the
    -- N-th latest planned start
    local nth = planned[n]
    -- the oldest waiter (but the caller) not back a step after its turn: the broker holds
    -- it back behind newer messages (a burst), and its slot idles meanwhile
    local tol = math.max(margin, step)
    local late = redis.call('ZRANGEBYSCORE', KEYS[3], now - cap, '(' .. (now - tol),
                            'WITHSCORES', 'LIMIT', 0, 2)
    local missing
    if late[1] and late[1] ~= owner then missing = tonumber(late[2])
    elseif late[3] then missing = tonumber(late[4]) end
    local stretch = tonumber(ARGV[19]) or 0
    local function plan()
      local ahead = step
      -- stretched where the release would call it: the stretch is more than the wake's
      -- threshold (short runs keep the plain plan: a wake per run would cost a message each)
      if stretch > 0 and (stretch - 1) * step > tonumber(ARGV[20]) then
        ahead = math.ceil(step * stretch)
      end
      local at = math.max(now + margin, (nth or now) + ahead)
      if missing then
        -- held back as that one is, several times as long again (at most a quarter of the
        -- longest wait, so that the turns planned after it stay within the longest wait)
        at = math.max(at, now + math.min(cap / 4, tonumber(ARGV[18]) * (now - missing)))
      end
      -- jitter, part of the turn (up to a tenth of a step, at most 1 s)
      return at + math.floor(tonumber(ARGV[15]) * math.min(1000, step / 10))
    end
    local due
    if mine and mine <= now + margin / 2 then
      -- a waiter back for its turn takes any free slot (none is held for another waiter);
      -- if the runs outlasted the plan and none is free, it is planned again
      if not free then due = plan() end
    elseif not free or (not missing and nth and nth + step > now) then
      -- a newcomer (or a waiter back before its turn: its countdown was cut to the longest
      -- wait) takes a free slot no planned turn needs, or any free slot while waiters miss
      -- their turns; else it is planned (the early waiter keeps its turn)
      due = mine or plan()
    end
    if due then
      redis.call('ZADD', KEYS[3], due, owner)
      redis.call('ZREM', KEYS[5], owner)
      keep()
      return {0, 'concurrency', math.min(due, now + cap), now}
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
  -- the slot is this admission's grant; one of the same task that held it is superseded
  local g = redis.call('HGET', KEYS[1], 'g:' .. owner)
  if holds and g and g ~= ARGV[2] then redis.call('ZADD', KEYS[6], now + lease, 'n:' .. g) end
  redis.call('HSET', KEYS[1], 'g:' .. owner, ARGV[2])
  redis.call('ZREM', KEYS[6], 'o:' .. owner)
  redis.call('ZADD', KEYS[2], now + lease, owner)
  redis.call('ZREM', KEYS[3], owner)
end
keep()
if holds then return {1, now, 1} end
return {1, now}
"""

# THROTTLE_RELEASE — free the caller's concurrency slot at the end of its run (T4: one round
# trip) and fold the run's duration into the average run ('avg') the waiters' turns are
# planned with. The slot is free for any waiter back for its turn (see THROTTLE_ADMIT).
# It leaves tombstones (K:done) for a lease: the grant's nonce and the owner.
# The wake: with KEYS[4] (the waiters) and ARGV[2] > 0, if fewer waiters are on their way
# (a turn within ARGV[2] ms of now either side, one called by an earlier release included)
# than slots are free, the waiter of the earliest turn more than ARGV[2] ms away (the runs
# ended sooner than planned) is called now: its turn moves to now (so the slot waits for it,
# as for any waiter back for its turn) and the release names it, for the front-end to bring
# the waiter's held message forward. A waiter late by more than ARGV[2] ms is missing (held
# back behind a burst, revoked, lost): it neither takes a slot nor blocks a wake.
# KEYS[1] hash, KEYS[2] slots, KEYS[3] tombstones[, KEYS[4] waiters]; ARGV[1] owner[, ARGV[2]
# wake ms, ARGV[3] lease ms]
# Returns 1 when the caller's slot was freed, or had been by a release this one re-sends (S7:
# as the first; a re-send wakes nobody), 0 when it held none (lapsed, or taken by nothing),
# {1, waiter} when it was freed and ``waiter`` was called.
THROTTLE_RELEASE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
if redis.call('ZREM', KEYS[2], ARGV[1]) == 0 then
  if redis.call('ZSCORE', KEYS[3], 'o:' .. ARGV[1]) then return 1 end
  return 0
end
local lease = tonumber(redis.call('HGET', KEYS[1], 'l')) or 60000
local g = redis.call('HGET', KEYS[1], 'g:' .. ARGV[1])
if g then redis.call('ZADD', KEYS[3], now + lease, 'n:' .. g) end
redis.call('ZADD', KEYS[3], now + lease, 'o:' .. ARGV[1])
redis.call('HDEL', KEYS[1], 'g:' .. ARGV[1])
if redis.call('PTTL', KEYS[3]) < lease then redis.call('PEXPIRE', KEYS[3], lease) end
local started = tonumber(redis.call('HGET', KEYS[1], 's:' .. ARGV[1]))
if started then
  local took = math.max(1, now - started)
  local avg = tonumber(redis.call('HGET', KEYS[1], 'avg'))
  if avg then took = math.floor(avg * 0.7 + took * 0.3) end
  redis.call('HSET', KEYS[1], 'avg', took)
  redis.call('HDEL', KEYS[1], 's:' .. ARGV[1])
end
local wake = tonumber(ARGV[2]) or 0
if wake > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', '(' .. (now - tonumber(ARGV[3])))
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
  -- the waiters on their way (a turn within the threshold either side of now, a waiter
  -- called by an earlier release included) take the free slots first; one later than that
  -- is missing (held back, revoked, lost) and calls for nobody
  local free = (tonumber(redis.call('HGET', KEYS[1], 'n')) or 1) - redis.call('ZCARD', KEYS[2])
  if redis.call('ZCOUNT', KEYS[4], now - wake, now + wake) < free then
    local w = redis.call('ZRANGEBYSCORE', KEYS[4], '(' .. (now + wake), '+inf', 'LIMIT', 0, 1)
    if w[1] then
      redis.call('ZADD', KEYS[4], now, w[1])
      return {1, w[1]}
    end
  end
end
return 1
"""

# THROTTLE_RENEW — the lease of a running job's concurrency slot (as RENEW for a lock).
# KEYS[1] hash, KEYS[2] slots, KEYS[3] tombstones; ARGV[1] owner, ARGV[2] ttl ms, ARGV[3]
# concurrency, ARGV[4] deadline ms (server clock; "0": none)
# Returns "1" when the caller's slot was extended, "2" when it had lapsed and was free to take
# back, "0" when it had lapsed and every slot is taken, "4" when its owner released it (a
# renewal never takes a released slot back), "L"..now run past the deadline (nothing changed).
THROTTLE_RENEW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local deadline = tonumber(ARGV[4])
if deadline > 0 and now > deadline then return 'L' .. now end
local ttl = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
local answer = '1'
if not redis.call('ZSCORE', KEYS[2], ARGV[1]) then
  if (tonumber(redis.call('ZSCORE', KEYS[3], 'o:' .. ARGV[1])) or 0) > now then return '4' end
  if redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[3]) then return '0' end
  answer = '2'
end
redis.call('ZADD', KEYS[2], 'GT', now + ttl, ARGV[1])
for i = 1, 2 do
  if redis.call('PTTL', KEYS[i]) < ttl then redis.call('PEXPIRE', KEYS[i], ttl) end
end
return answer
"""

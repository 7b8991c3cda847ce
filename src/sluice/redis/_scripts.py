"""The Lua scripts of the shared limiter and the shared budget (run by SHA, loaded once).

Every script reads Redis's own clock (``TIME``), never the client's, and sets an expiry
on every key it writes, so an idle deployment leaves nothing behind. Times are
milliseconds; numbers that are not integers go back to the client as strings (Redis
would truncate a Lua number to an integer).
"""

from __future__ import annotations

__all__ = [
    "ACQUIRE",
    "BUDGET_ADJUST",
    "BUDGET_REFRESH",
    "BUDGET_RESERVE",
    "BUDGET_SETTLE",
    "OBSERVE",
    "PENALIZE",
    "REFRESH",
    "SETTLE",
]

# KEYS: 1 state (hash), 2 grants (zset id -> grant time), 3 grant tokens (hash id -> tokens),
#       4 leases (zset id -> expiry), 5 waiting-for-a-lease flag, 6 waiting-for-tokens flag.
_PRELUDE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local INF = math.huge
local st, grants, gtok, leases = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local function fmt(x) return string.format('%.17g', x) end
local function touch(ttl)  -- not the waiting flags (KEYS 5 and 6): they keep their own expiry
  for i = 1, 4 do redis.call('PEXPIRE', KEYS[i], ttl) end
end
local function learnt(configured, field)
  local v = tonumber(redis.call('HGET', st, field))
  if v and (configured < 0 or v < configured) then return v end
  return configured
end
-- Forget grants older than the window (and their tokens): the sliding-window ledger.
local function expire(span)
  local used_t = tonumber(redis.call('HGET', st, 'used_t')) or 0
  while true do
    local old = redis.call('ZRANGEBYSCORE', grants, '-inf', now - span, 'LIMIT', 0, 500)
    if #old == 0 then break end
    local toks = redis.call('HMGET', gtok, unpack(old))
    for i = 1, #old do used_t = used_t - (tonumber(toks[i]) or 0) end
    redis.call('HDEL', gtok, unpack(old))
    redis.call('ZREM', grants, unpack(old))
  end
  if used_t < 0 then used_t = 0 end
  return used_t
end
"""

ACQUIRE = (
    _PRELUDE
    + """
-- ARGV: tokens, requests limit, tokens limit (-1: none), window ms, max in flight (-1),
--       burst requests, burst tokens, lease ms, grant id, window margin ms, catch-up ms, ttl ms
local tokens = tonumber(ARGV[1])
local window = tonumber(ARGV[4])
local mif = tonumber(ARGV[5])
local burst_r, burst_t = tonumber(ARGV[6]), tonumber(ARGV[7])
local lease, id = tonumber(ARGV[8]), ARGV[9]
local span = window + tonumber(ARGV[10])
local catch_up, ttl = tonumber(ARGV[11]), tonumber(ARGV[12])
local lim_r = learnt(tonumber(ARGV[2]), 'lr')
local lim_t = learnt(tonumber(ARGV[3]), 'lt')

redis.call('ZREMRANGEBYSCORE', leases, '-inf', now)
if mif >= 0 and redis.call('ZCARD', leases) >= mif then
  local first = redis.call('ZRANGE', leases, 0, 0, 'WITHSCORES')
  redis.call('SET', KEYS[5], '1', 'PX', math.floor(lease) + 1)
  return {0, fmt(tonumber(first[2]) - now), 'in_flight'}
end

local used_t = expire(span)
local s = redis.call('HMGET', st, 'tat_r', 'tat_t', 'paused', 'xr', 'xr_until', 'xt', 'xt_until')
local tat_r, tat_t = tonumber(s[1]) or -INF, tonumber(s[2]) or -INF
local at = tonumber(s[3]) or -INF
local used_r = redis.call('ZCARD', grants)

-- When the oldest grants will have freed ``need`` requests (or tokens).
local function freed_at(need, requests)
  if need <= 1e-9 then return now end
  if requests then
    local e = redis.call('ZRANGE', grants, math.ceil(need - 1e-9) - 1, math.ceil(need - 1e-9) - 1, 'WITHSCORES')
    if #e == 0 then return INF end
    return tonumber(e[2]) + span
  end
  local ids = redis.call('ZRANGE', grants, 0, -1, 'WITHSCORES')
  local sum = 0
  for i = 1, #ids, 2 do
    sum = sum + (tonumber(redis.call('HGET', gtok, ids[i])) or 0)
    if sum >= need - 1e-9 then return tonumber(ids[i + 1]) + span end
  end
  return INF
end
-- When the window has room for ``amount`` more, outside traffic (``ext``, learnt from
-- headers, until ``ext_until``) counted while it lasts.
local function ready(used, ext, ext_until, amount, cap, requests)
  if now >= ext_until then ext = 0 end
  if used + ext + amount <= cap + 1e-9 then return now end
  local a = freed_at(used + ext + amount - cap, requests)
  if ext > 0 then
    local b = math.max(ext_until, freed_at(used + amount - cap, requests))
    if b < a then a = b end
  end
  return a
end

local why = 'requests'
if lim_r >= 0 then
  local interval = window / lim_r
  at = math.max(at, tat_r - burst_r * interval,
    ready(used_r, tonumber(s[4]) or 0, tonumber(s[5]) or -INF, 1, math.max(1, lim_r), true))
end
if lim_t >= 0 and tokens > 0 then
  local interval = window / lim_t
  local tat = math.max(tat_t - burst_t * interval,
    ready(used_t, tonumber(s[6]) or 0, tonumber(s[7]) or -INF, tokens, math.max(tokens, lim_t), false))
  if tat > at then at = tat; why = 'tokens' end
end
if at > now then
  if why == 'tokens' then redis.call('SET', KEYS[6], '1', 'PX', math.floor(math.min(at - now, 60000)) + 1) end
  return {0, fmt(at - now), why}
end

redis.call('ZADD', grants, now, id)
redis.call('HSET', gtok, id, tokens)
used_t = used_t + tokens
if lim_r >= 0 then
  if tat_r < now - catch_up then tat_r = now end
  tat_r = tat_r + window / lim_r
end
if lim_t >= 0 and tokens > 0 then
  if tat_t < now - catch_up then tat_t = now end
  tat_t = tat_t + tokens * window / lim_t
end
redis.call('HSET', st, 'used_t', used_t, 'tat_r', fmt(tat_r), 'tat_t', fmt(tat_t))
if mif >= 0 then redis.call('ZADD', leases, now + lease, id) end
touch(ttl)
return {1, fmt(now), ''}
"""
)

SETTLE = (
    _PRELUDE
    + """
-- ARGV: grant id, token change (reconcile), refund (1/0), release lease (1/0),
--       requests limit, tokens limit, window ms, ttl ms, channel, the grant's tokens
local id, delta = ARGV[1], tonumber(ARGV[2])
local refund, release = ARGV[3] == '1', ARGV[4] == '1'
local window, ttl, channel = tonumber(ARGV[7]), tonumber(ARGV[8]), ARGV[9]
local lim_r = learnt(tonumber(ARGV[5]), 'lr')
local lim_t = learnt(tonumber(ARGV[6]), 'lt')
local in_window = redis.call('ZSCORE', grants, id)
local freed = false
if refund then
  local tokens = tonumber(ARGV[10])
  if in_window then
    tokens = tonumber(redis.call('HGET', gtok, id)) or tokens
    local used_t = (tonumber(redis.call('HGET', st, 'used_t')) or 0) - tokens
    if used_t < 0 then used_t = 0 end
    redis.call('HSET', st, 'used_t', used_t)
    redis.call('ZREM', grants, id)
    redis.call('HDEL', gtok, id)
  end
  if lim_r >= 0 then redis.call('HINCRBYFLOAT', st, 'tat_r', fmt(-window / lim_r)) end
  if lim_t >= 0 and tokens > 0 then redis.call('HINCRBYFLOAT', st, 'tat_t', fmt(-tokens * window / lim_t)) end
  freed = true
elseif delta ~= 0 then
  if in_window then
    redis.call('HINCRBY', gtok, id, delta)
    redis.call('HINCRBY', st, 'used_t', delta)
  end
  if lim_t >= 0 then redis.call('HINCRBYFLOAT', st, 'tat_t', fmt(delta * window / lim_t)) end
  freed = delta < 0
end
if freed and redis.call('EXISTS', KEYS[6]) == 1 then redis.call('PUBLISH', channel, 'tokens') end
if release and redis.call('ZREM', leases, id) == 1 and redis.call('EXISTS', KEYS[5]) == 1 then
  redis.call('PUBLISH', channel, 'lease')
end
if redis.call('EXISTS', st) == 1 then touch(ttl) end
return 1
"""
)

REFRESH = """
-- KEYS: 1 leases. ARGV: lease ms, ttl ms, lease ids... : a live holder keeps its leases.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local n = 0
for i = 3, #ARGV do n = n + redis.call('ZADD', KEYS[1], 'XX', 'CH', now + tonumber(ARGV[1]), ARGV[i]) end
if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2])) end
return n
"""

PENALIZE = (
    _PRELUDE
    + """
-- ARGV: pause ms, ttl ms. Pauses the deployment for every process.
local until_ = now + tonumber(ARGV[1])
local paused = tonumber(redis.call('HGET', st, 'paused')) or -INF
if until_ > paused then redis.call('HSET', st, 'paused', fmt(until_)) end
touch(math.max(tonumber(ARGV[2]), tonumber(ARGV[1]) + 1000))
return 1
"""
)

OBSERVE = (
    _PRELUDE
    + """
-- ARGV (per our window; -1 when the header was absent): requests limit, tokens limit,
--   remaining requests, reset requests ms, remaining tokens, reset tokens ms,
--   configured requests limit, configured tokens limit, window ms, margin ms, ttl ms
local function arg(i) local v = tonumber(ARGV[i]); if v and v >= 0 then return v end return nil end
local window, span, ttl = tonumber(ARGV[9]), tonumber(ARGV[9]) + tonumber(ARGV[10]), tonumber(ARGV[11])
local used_t = expire(span)
local used_r = redis.call('ZCARD', grants)
local new_r, new_t = arg(1), arg(2)
-- learnt when lower than what binds now, or when nothing binds (-1: no limit configured)
local function lower(new, current) return new and (current < 0 or new < current) end
if lower(new_r, learnt(tonumber(ARGV[7]), 'lr')) then redis.call('HSET', st, 'lr', fmt(new_r)) end
if lower(new_t, learnt(tonumber(ARGV[8]), 'lt')) then redis.call('HSET', st, 'lt', fmt(new_t)) end
local lim_r, lim_t = learnt(tonumber(ARGV[7]), 'lr'), learnt(tonumber(ARGV[8]), 'lt')
local rem_r, reset_r, rem_t, reset_t = arg(3), arg(4), arg(5), arg(6)
if lim_r >= 0 and rem_r and reset_r then
  local unseen = lim_r - used_r - rem_r
  if unseen > 0 then redis.call('HSET', st, 'xr', fmt(unseen), 'xr_until', fmt(now + reset_r)) end
end
if lim_t >= 0 and rem_t and reset_t then
  local unseen = lim_t - used_t - rem_t
  if unseen > 0 then redis.call('HSET', st, 'xt', fmt(unseen), 'xt_until', fmt(now + reset_t)) end
end
redis.call('HSET', st, 'used_t', used_t)
touch(ttl)
return 1
"""
)

# -- the shared budget --------------------------------------------------------------------
# KEYS: 1 totals (hash: limit, spent, reserved, expired), 2 holds (zset id -> expiry),
#       3 hold amounts (hash id -> micro-dollars), 4 expired holds (hash id -> micro-dollars).
#       Amounts are integers (micro-dollars), so sums never drift however many holds come and go.
_BUDGET_PRELUDE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local totals, holds, amounts = KEYS[1], KEYS[2], KEYS[3]
local function touch(ttl) for i = 1, #KEYS do redis.call('PEXPIRE', KEYS[i], ttl) end end
-- A hold whose holder stopped refreshing it is counted as spent at its worst case: the
-- holder may have died after the provider billed the request.
local function expire()
  while true do
    local old = redis.call('ZRANGEBYSCORE', holds, '-inf', now, 'LIMIT', 0, 500)
    if #old == 0 then break end
    local vals = redis.call('HMGET', amounts, unpack(old))
    local sum = 0
    for i = 1, #old do sum = sum + (tonumber(vals[i]) or 0) end
    redis.call('HINCRBY', totals, 'reserved', -sum)
    redis.call('HINCRBY', totals, 'spent', sum)
    redis.call('HINCRBY', totals, 'expired', sum)
    for i = 1, #old do redis.call('HSET', KEYS[4], old[i], tonumber(vals[i]) or 0) end
    redis.call('HDEL', amounts, unpack(old))
    redis.call('ZREM', holds, unpack(old))
  end
end
"""

BUDGET_RESERVE = (
    _BUDGET_PRELUDE
    + """
-- ARGV: hold id, amount (micro-dollars), lease ms, ttl ms, limit this process asked for
-- (set only if the budget has none: the first process to use a name sets its limit).
-- Returns {1, 0, limit} granted; {0, ms until the next hold expires, limit} wait;
-- {-1, left, limit} refused.
-- A process that only joins the budget asks -1: it never creates one (after Redis lost
-- its data, the budget's owner re-creates it with what was spent); {0, -1, -1}: wait.
local id, amount, lease = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local ttl, asked = tonumber(ARGV[4]), tonumber(ARGV[5])
if asked >= 0 then redis.call('HSETNX', totals, 'limit', asked) end
local limit = tonumber(redis.call('HGET', totals, 'limit'))
if not limit then return {0, -1, -1} end
expire()
local spent = tonumber(redis.call('HGET', totals, 'spent')) or 0
local reserved = tonumber(redis.call('HGET', totals, 'reserved')) or 0
if spent + reserved + amount <= limit then
  redis.call('HINCRBY', totals, 'reserved', amount)
  redis.call('ZADD', holds, now + lease, id)
  redis.call('HSET', amounts, id, amount)
  touch(ttl)
  return {1, 0, limit}
end
touch(ttl)
local first = redis.call('ZRANGE', holds, 0, 0, 'WITHSCORES')
if #first == 0 then return {-1, limit - spent - reserved, limit} end
return {0, string.format('%.17g', tonumber(first[2]) - now), limit}
"""
)

BUDGET_SETTLE = (
    _BUDGET_PRELUDE
    + """
-- ARGV: hold id, actual cost (micro-dollars), ttl ms, channel. A hold that expired
-- while its holder lived (it could not refresh: Redis was down longer than the lease)
-- was counted at its worst case; its late settle corrects that to the actual cost.
local id, actual, ttl, channel = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
expire()
local amount = tonumber(redis.call('HGET', amounts, id))
if not amount then
  local counted = tonumber(redis.call('HGET', KEYS[4], id))
  if not counted then
    -- Redis lost the hold (restarted without its data): the money was spent all the
    -- same. Counted, and noted apart so that an owner re-counting earlier spending
    -- (spent_at_least) adds to it rather than hiding it under a maximum.
    redis.call('HINCRBY', totals, 'spent', actual)
    redis.call('HINCRBY', totals, 'orphaned', actual)
    touch(ttl)
    redis.call('PUBLISH', channel, 'settled')
    return 3
  end
  redis.call('HDEL', KEYS[4], id)
  redis.call('HINCRBY', totals, 'spent', actual - counted)
  redis.call('HINCRBY', totals, 'expired', -counted)
  touch(ttl)
  redis.call('PUBLISH', channel, 'settled')
  return 2
end
redis.call('HINCRBY', totals, 'reserved', -amount)
redis.call('HINCRBY', totals, 'spent', actual)
redis.call('HDEL', amounts, id)
redis.call('ZREM', holds, id)
touch(ttl)
redis.call('PUBLISH', channel, 'settled')
return 1
"""
)

BUDGET_REFRESH = """
-- KEYS: 1 holds. ARGV: lease ms, hold ids...: a live holder keeps its holds.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local n = 0
for i = 2, #ARGV do n = n + redis.call('ZADD', KEYS[1], 'XX', 'CH', now + tonumber(ARGV[1]), ARGV[i]) end
return n
"""

BUDGET_ADJUST = (
    _BUDGET_PRELUDE
    + """
-- ARGV: op ('limit' | 'spent_at_least'), micro-dollars, ttl ms, channel, and for 'limit'
-- a floor for spent (-1: none), set in the same step: no process is granted anything
-- between a re-created limit and the spending counted against it.
local op, value, ttl, channel = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local floor = tonumber(ARGV[5] or '-1')
expire()
if op == 'limit' then
  redis.call('HSET', totals, 'limit', value)
else
  floor = value
end
if floor >= 0 then
  local spent = tonumber(redis.call('HGET', totals, 'spent')) or 0
  floor = floor + (tonumber(redis.call('HGET', totals, 'orphaned')) or 0)
  if floor > spent then redis.call('HSET', totals, 'spent', floor) end
end
touch(ttl)
redis.call('PUBLISH', channel, 'adjusted')
local v = redis.call('HMGET', totals, 'limit', 'spent', 'reserved', 'expired')
return v
"""
)

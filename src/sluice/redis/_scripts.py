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
#       4 leases (zset id -> expiry), 5 waiting-for-a-lease flag, 6 waiting-for-tokens flag,
#       7 grant input tokens, 8 grant output tokens (hashes id -> tokens).
# The token limits are three dimensions alike: tokens (tpm), input (itpm), output (otpm),
# each with its per-grant hash, its count in the window (state 'used_*'), its pacer
# ('tat_*'), outside traffic learnt from headers ('x*' until 'x*_until') and a limit
# learnt from headers ('l*'). A grant's input and output are kept only while their limit
# is known (configured or learnt): a deployment without them costs nothing more.
_PRELUDE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local INF = math.huge
local st, grants, gtok, leases = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local DIMS = {
  {hash = KEYS[3], used = 'used_t', tat = 'tat_t', x = 'xt', xu = 'xt_until', learnt = 'lt'},
  {hash = KEYS[7], used = 'used_i', tat = 'tat_i', x = 'xi', xu = 'xi_until', learnt = 'li'},
  {hash = KEYS[8], used = 'used_o', tat = 'tat_o', x = 'xo', xu = 'xo_until', learnt = 'lo'},
}
local function fmt(x) return string.format('%.17g', x) end
local function touch(ttl)  -- not the waiting flags (KEYS 5 and 6): they keep their own expiry
  for i = 1, 4 do redis.call('PEXPIRE', KEYS[i], ttl) end
  for i = 7, 8 do redis.call('PEXPIRE', KEYS[i], ttl) end
end
-- Move a pacer's schedule by ``by`` ms (a reconcile, a refund); one never started stays so.
local function shift(field, by)
  local v = tonumber(redis.call('HGET', st, field))
  if v and v > -INF and v < INF then redis.call('HSET', st, field, fmt(v + by)) end
end
local function learnt(configured, field)
  local v = tonumber(redis.call('HGET', st, field))
  if v and (configured < 0 or v < configured) then return v end
  return configured
end
-- Forget grants older than the window (and their tokens): the sliding-window ledger.
-- Returns what the window holds of each token dimension.
local function expire(span)
  local used = {}
  for d = 1, 3 do used[d] = tonumber(redis.call('HGET', st, DIMS[d].used)) or 0 end
  while true do
    local old = redis.call('ZRANGEBYSCORE', grants, '-inf', now - span, 'LIMIT', 0, 500)
    if #old == 0 then break end
    for d = 1, 3 do
      local vals = redis.call('HMGET', DIMS[d].hash, unpack(old))
      for i = 1, #old do used[d] = used[d] - (tonumber(vals[i]) or 0) end
      redis.call('HDEL', DIMS[d].hash, unpack(old))
    end
    redis.call('ZREM', grants, unpack(old))
  end
  for d = 1, 3 do if used[d] < 0 then used[d] = 0 end end
  return used
end
"""

ACQUIRE = (
    _PRELUDE
    + """
-- ARGV: tokens, requests limit, tokens limit (-1: none), window ms, max in flight (-1),
--       burst requests, burst tokens, lease ms, grant id, window margin ms, catch-up ms, ttl ms,
--       input tokens, output tokens, input limit (-1), output limit (-1)
local window = tonumber(ARGV[4])
local mif = tonumber(ARGV[5])
local burst_r = tonumber(ARGV[6])
local lease, id = tonumber(ARGV[8]), ARGV[9]
local span = window + tonumber(ARGV[10])
local catch_up, ttl = tonumber(ARGV[11]), tonumber(ARGV[12])
local lim_r = learnt(tonumber(ARGV[2]), 'lr')
local amounts = {tonumber(ARGV[1]), tonumber(ARGV[13]), tonumber(ARGV[14])}
local lims = {learnt(tonumber(ARGV[3]), 'lt'), learnt(tonumber(ARGV[15]), 'li'), learnt(tonumber(ARGV[16]), 'lo')}
local bursts = {tonumber(ARGV[7]), 0, 0}

redis.call('ZREMRANGEBYSCORE', leases, '-inf', now)
if mif >= 0 and redis.call('ZCARD', leases) >= mif then
  local first = redis.call('ZRANGE', leases, 0, 0, 'WITHSCORES')
  redis.call('SET', KEYS[5], '1', 'PX', math.floor(lease) + 1)
  return {0, fmt(tonumber(first[2]) - now), 'in_flight'}
end

local used = expire(span)
local s = redis.call('HMGET', st, 'tat_r', 'paused', 'xr', 'xr_until')
local tat_r = tonumber(s[1]) or -INF
local at = tonumber(s[2]) or -INF
local used_r = redis.call('ZCARD', grants)

-- When the oldest grants will have freed ``need`` requests (``hash`` nil) or tokens.
local function freed_at(need, hash)
  if need <= 1e-9 then return now end
  if not hash then
    local e = redis.call('ZRANGE', grants, math.ceil(need - 1e-9) - 1, math.ceil(need - 1e-9) - 1, 'WITHSCORES')
    if #e == 0 then return INF end
    return tonumber(e[2]) + span
  end
  local ids = redis.call('ZRANGE', grants, 0, -1, 'WITHSCORES')
  local sum = 0
  for i = 1, #ids, 2 do
    sum = sum + (tonumber(redis.call('HGET', hash, ids[i])) or 0)
    if sum >= need - 1e-9 then return tonumber(ids[i + 1]) + span end
  end
  return INF
end
-- When the window has room for ``amount`` more, outside traffic (``ext``, learnt from
-- headers, until ``ext_until``) counted while it lasts.
local function ready(used, ext, ext_until, amount, cap, hash)
  if now >= ext_until then ext = 0 end
  if used + ext + amount <= cap + 1e-9 then return now end
  local a = freed_at(used + ext + amount - cap, hash)
  if ext > 0 then
    local b = math.max(ext_until, freed_at(used + amount - cap, hash))
    if b < a then a = b end
  end
  return a
end

local why = 'requests'
if lim_r >= 0 then
  local interval = window / lim_r
  at = math.max(at, tat_r - burst_r * interval,
    ready(used_r, tonumber(s[3]) or 0, tonumber(s[4]) or -INF, 1, math.max(1, lim_r), nil))
end
local tats = {}
for d = 1, 3 do
  local dim, amount, lim = DIMS[d], amounts[d], lims[d]
  local x = redis.call('HMGET', st, dim.tat, dim.x, dim.xu)
  tats[d] = tonumber(x[1]) or -INF
  if lim >= 0 and amount > 0 then
    local interval = window / lim
    local tat = math.max(tats[d] - bursts[d] * interval,
      ready(used[d], tonumber(x[2]) or 0, tonumber(x[3]) or -INF, amount, math.max(amount, lim), dim.hash))
    if tat > at then at = tat; why = 'tokens' end
  end
end
if at > now then
  if why == 'tokens' then redis.call('SET', KEYS[6], '1', 'PX', math.floor(math.min(at - now, 60000)) + 1) end
  return {0, fmt(at - now), why}
end

redis.call('ZADD', grants, now, id)
if lim_r >= 0 then
  if tat_r < now - catch_up then tat_r = now end
  tat_r = tat_r + window / lim_r
end
local fields = {'tat_r', fmt(tat_r)}
for d = 1, 3 do
  local dim, amount, lim = DIMS[d], amounts[d], lims[d]
  if d == 1 or lim >= 0 then  -- input and output are kept only under a limit
    redis.call('HSET', dim.hash, id, amount)
    used[d] = used[d] + amount
  end
  if lim >= 0 and amount > 0 then
    if tats[d] < now - catch_up then tats[d] = now end
    tats[d] = tats[d] + amount * window / lim
  end
  table.insert(fields, dim.used); table.insert(fields, used[d])
  table.insert(fields, dim.tat); table.insert(fields, fmt(tats[d]))
end
redis.call('HSET', st, unpack(fields))
if mif >= 0 then redis.call('ZADD', leases, now + lease, id) end
touch(ttl)
return {1, fmt(now), ''}
"""
)

SETTLE = (
    _PRELUDE
    + """
-- ARGV: grant id, token change (reconcile), refund (1/0), release lease (1/0),
--       requests limit, tokens limit, window ms, ttl ms, channel, the grant's tokens,
--       input change, output change, input limit, output limit, the grant's input, output
local id = ARGV[1]
local refund, release = ARGV[3] == '1', ARGV[4] == '1'
local window, ttl, channel = tonumber(ARGV[7]), tonumber(ARGV[8]), ARGV[9]
local lim_r = learnt(tonumber(ARGV[5]), 'lr')
local lims = {learnt(tonumber(ARGV[6]), 'lt'), learnt(tonumber(ARGV[13]), 'li'), learnt(tonumber(ARGV[14]), 'lo')}
local deltas = {tonumber(ARGV[2]), tonumber(ARGV[11]), tonumber(ARGV[12])}
local given = {tonumber(ARGV[10]), tonumber(ARGV[15]), tonumber(ARGV[16])}
local in_window = redis.call('ZSCORE', grants, id)
local freed = false
if refund then
  for d = 1, 3 do
    local dim, amount = DIMS[d], given[d]
    local kept = in_window and tonumber(redis.call('HGET', dim.hash, id))
    if kept then
      amount = kept
      local left = (tonumber(redis.call('HGET', st, dim.used)) or 0) - kept
      if left < 0 then left = 0 end
      redis.call('HSET', st, dim.used, left)
      redis.call('HDEL', dim.hash, id)
    elseif in_window and d > 1 then
      amount = 0  -- granted while this limit was unknown: it took nothing of it
    end
    if lims[d] >= 0 and amount > 0 then shift(dim.tat, -amount * window / lims[d]) end
  end
  if in_window then redis.call('ZREM', grants, id) end
  if lim_r >= 0 then shift('tat_r', -window / lim_r) end
  freed = true
else
  for d = 1, 3 do
    local dim, delta = DIMS[d], deltas[d]
    if delta ~= 0 then
      local kept = in_window and redis.call('HEXISTS', dim.hash, id) == 1
      if kept then
        redis.call('HINCRBY', dim.hash, id, delta)
        redis.call('HINCRBY', st, dim.used, delta)
      end
      if lims[d] >= 0 and (kept or not in_window or d == 1) then
        shift(dim.tat, delta * window / lims[d])
      end
      if delta < 0 then freed = true end
    end
  end
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
--   configured requests limit, configured tokens limit, window ms, margin ms, ttl ms,
--   then for input and output tokens each: limit, remaining, reset ms, configured limit
local function arg(i) local v = tonumber(ARGV[i]); if v and v >= 0 then return v end return nil end
local window, span, ttl = tonumber(ARGV[9]), tonumber(ARGV[9]) + tonumber(ARGV[10]), tonumber(ARGV[11])
local used = expire(span)
local used_r = redis.call('ZCARD', grants)
-- learnt when lower than what binds now, or when nothing binds (-1: no limit configured)
local function lower(new, current) return new and (current < 0 or new < current) end
-- a limit learnt from the headers, then outside traffic: what the server counts beyond our window
local function learn(field, new, configured, rem, reset, used_now, x, xu)
  if lower(new, learnt(configured, field)) then redis.call('HSET', st, field, fmt(new)) end
  local lim = learnt(configured, field)
  if lim >= 0 and rem and reset then
    local unseen = lim - used_now - rem
    if unseen > 0 then redis.call('HSET', st, x, fmt(unseen), xu, fmt(now + reset)) end
  end
end
learn('lr', arg(1), tonumber(ARGV[7]), arg(3), arg(4), used_r, 'xr', 'xr_until')
learn('lt', arg(2), tonumber(ARGV[8]), arg(5), arg(6), used[1], 'xt', 'xt_until')
learn('li', arg(12), tonumber(ARGV[15]), arg(13), arg(14), used[2], 'xi', 'xi_until')
learn('lo', arg(16), tonumber(ARGV[19]), arg(17), arg(18), used[3], 'xo', 'xo_until')
redis.call('HSET', st, 'used_t', used[1], 'used_i', used[2], 'used_o', used[3])
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

"""Lua scripts of the Redis quota store. Each runs atomically inside Redis (no read-modify-write race).

Buckets are hashes ``{l: level, t: updated_at}`` mirroring ``tenancy.token_bucket``; a missing
bucket is full. Concurrency slots are a sorted set ``lease_id -> expiry``; expired members are
pruned before counting, so a crashed router's slots come back after the lease TTL. Floats are
returned as strings (Redis would truncate Lua numbers to integers).

Time is Redis's own ``TIME`` (an empty ``now`` argument), so every router's buckets and slots run on
one clock whatever the routers' clocks say; tests and simulations pass their own ``now``.

Every charge is marked per request (the ``{tenant}:req:<lease id>`` key, expiring with the lease):
an acquire or a debit that runs twice for one request, because its first reply was lost to a
timeout, charges once.
"""

from __future__ import annotations

_LIB = """
local function clock(arg)
  if arg ~= '' then return tonumber(arg) end
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end
local function load_bucket(key, cap, now)
  local v = redis.call('HMGET', key, 'l', 't')
  local level = tonumber(v[1])
  local ts = tonumber(v[2])
  if level == nil or ts == nil then return cap end
  local elapsed = now - ts
  if elapsed < 0 then elapsed = 0 end
  return math.min(cap, level + elapsed * cap / 60.0)
end
local function save_bucket(key, level, cap, now)
  redis.call('HSET', key, 'l', tostring(level), 't', tostring(now))
  redis.call('PEXPIRE', key, math.ceil((cap - level) * 60000.0 / cap) + 1000)
end
"""

# KEYS: rpm, tpm, conc, budget, request mark
# ARGV: now ('' = Redis TIME), rpm_cap, tpm_cap, tokens, conc_max, lease_id, lease_ttl_s,
#       budget (-1: none), budget_ttl_s, lease_ttl_ms
# Returns {reason, retry, rpm level, tpm level, active, used, now, repeated}; repeated = 1 when this
# request was admitted before (a retry after a lost reply): admitted again, charged nothing.
ACQUIRE = (
    _LIB
    + """
local now = clock(ARGV[1])
local rpm_cap = tonumber(ARGV[2])
local tpm_cap = tonumber(ARGV[3])
local tokens = tonumber(ARGV[4])
local budget = tonumber(ARGV[8])
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
local active = redis.call('ZCARD', KEYS[3])
local rl = load_bucket(KEYS[1], rpm_cap, now)
local tl = load_bucket(KEYS[2], tpm_cap, now)
local used = tonumber(redis.call('GET', KEYS[4]) or '0')
if redis.call('EXISTS', KEYS[5]) == 1 then
  return {'', '0', tostring(rl), tostring(tl), active, used, tostring(now), 1}
end
local reason = ''
local retry = 0
if active >= tonumber(ARGV[5]) then
  reason = 'concurrency'
elseif rl < 1 then
  reason = 'rpm'
  retry = (1 - rl) * 60.0 / rpm_cap
elseif tl < tokens then
  reason = 'tpm'
  retry = (tokens - tl) * 60.0 / tpm_cap
elseif budget >= 0 and used + tokens > budget then
  reason = 'daily_budget'
end
if reason == '' then
  rl = rl - 1
  tl = tl - tokens
  save_bucket(KEYS[1], rl, rpm_cap, now)
  save_bucket(KEYS[2], tl, tpm_cap, now)
  redis.call('ZADD', KEYS[3], now + tonumber(ARGV[7]), ARGV[6])
  redis.call('PEXPIRE', KEYS[3], tonumber(ARGV[10]))
  redis.call('SET', KEYS[5], 'a', 'PX', tonumber(ARGV[10]))
  if budget >= 0 then
    used = redis.call('INCRBY', KEYS[4], tokens)
    redis.call('EXPIRE', KEYS[4], tonumber(ARGV[9]))
  end
  active = active + 1
end
return {reason, tostring(retry), tostring(rl), tostring(tl), active, used, tostring(now), 0}
"""
)

# Idempotent by the slot: only the call that removes it refunds.
# KEYS: tpm, conc, budget
# ARGV: now ('' = Redis TIME), tpm_cap, lease_id, refund (reserved - used; negative charges the excess)
RELEASE = (
    _LIB
    + """
if redis.call('ZREM', KEYS[2], ARGV[3]) == 0 then return 0 end
local refund = tonumber(ARGV[4])
if refund ~= 0 then
  local now = clock(ARGV[1])
  local cap = tonumber(ARGV[2])
  local level = math.min(cap, load_bucket(KEYS[1], cap, now) + refund)
  save_bucket(KEYS[1], level, cap, now)
  if redis.call('EXISTS', KEYS[3]) == 1 then redis.call('DECRBY', KEYS[3], refund) end
end
return 1
"""
)

# Charge requests already admitted elsewhere (on a router's local buckets while Redis was down).
# Never refused and never dropped at an empty bucket: the level goes into debt, paid back by refill,
# so the charge counts the same whether it lands before or after other admissions (a router that
# reconnects late, or admissions that beat it to a restarted Redis). The debt is capped at one
# bucket, so a long outage does not lock a tenant out for long; a charge never raises a level.
# A request with a mark was charged already: by an acquire whose reply timed out (its slot is a
# phantom, held by no router: removed here) or by an earlier try of this debit.
# KEYS: rpm, tpm, budget, conc, then one request mark per request
# ARGV: now ('' = Redis TIME), rpm_cap, tpm_cap, budget (-1: none), budget_ttl_s, mark_ttl_ms,
#       then lease_id, tokens for each request, in the order of the marks
# Returns {requests charged, requests already charged}
DEBIT = (
    _LIB
    + """
local now = clock(ARGV[1])
local requests, tokens, repeated = 0, 0, 0
for i = 5, #KEYS do
  local arg = 7 + (i - 5) * 2
  if redis.call('EXISTS', KEYS[i]) == 1 then
    redis.call('ZREM', KEYS[4], ARGV[arg])
    repeated = repeated + 1
  else
    requests = requests + 1
    tokens = tokens + tonumber(ARGV[arg + 1])
    redis.call('SET', KEYS[i], 'd', 'PX', tonumber(ARGV[6]))
  end
end
local function charge(key, cap, amount)
  if amount == 0 then return end
  local level = load_bucket(key, cap, now)
  save_bucket(key, math.min(level, math.max(level - amount, -cap)), cap, now)
end
charge(KEYS[1], tonumber(ARGV[2]), requests)
charge(KEYS[2], tonumber(ARGV[3]), tokens)
if tonumber(ARGV[4]) >= 0 and tokens > 0 then
  redis.call('INCRBY', KEYS[3], tokens)
  redis.call('EXPIRE', KEYS[3], tonumber(ARGV[5]))
end
return {requests, repeated}
"""
)

# KEYS: conc; ARGV: lease_id, now ('' = Redis TIME), lease_ttl_s, lease_ttl_ms
RENEW = (
    _LIB
    + """
if redis.call('ZSCORE', KEYS[1], ARGV[1]) == false then return 0 end
redis.call('ZADD', KEYS[1], clock(ARGV[2]) + tonumber(ARGV[3]), ARGV[1])
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[4]))
return 1
"""
)

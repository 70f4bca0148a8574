"""Lua scripts of the Redis quota store. Each runs atomically inside Redis (no read-modify-write race).

Buckets are hashes ``{l: level, t: updated_at}`` mirroring ``tenancy.token_bucket``; a missing
bucket is full. Concurrency slots are a sorted set ``lease_id -> expiry``; expired members are
pruned before counting, so a crashed router's slots come back after the lease TTL. Floats are
returned as strings (Redis would truncate Lua numbers to integers).
"""

from __future__ import annotations

_BUCKET_LIB = """
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

# KEYS: rpm, tpm, conc, budget
# ARGV: now, rpm_cap, tpm_cap, tokens, conc_max, lease_id, lease_expiry, budget (-1: none),
#       budget_ttl_s, lease_ttl_ms
ACQUIRE = (
    _BUCKET_LIB
    + """
local now = tonumber(ARGV[1])
local rpm_cap = tonumber(ARGV[2])
local tpm_cap = tonumber(ARGV[3])
local tokens = tonumber(ARGV[4])
local budget = tonumber(ARGV[8])
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
local active = redis.call('ZCARD', KEYS[3])
local rl = load_bucket(KEYS[1], rpm_cap, now)
local tl = load_bucket(KEYS[2], tpm_cap, now)
local used = tonumber(redis.call('GET', KEYS[4]) or '0')
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
  redis.call('ZADD', KEYS[3], tonumber(ARGV[7]), ARGV[6])
  redis.call('PEXPIRE', KEYS[3], tonumber(ARGV[10]))
  if budget >= 0 then
    used = redis.call('INCRBY', KEYS[4], tokens)
    redis.call('EXPIRE', KEYS[4], tonumber(ARGV[9]))
  end
  active = active + 1
end
return {reason, tostring(retry), tostring(rl), tostring(tl), active, used}
"""
)

# KEYS: tpm, conc, budget
# ARGV: now, tpm_cap, lease_id, refund (reserved - used; negative charges the excess)
RELEASE = (
    _BUCKET_LIB
    + """
if redis.call('ZREM', KEYS[2], ARGV[3]) == 0 then return 0 end
local refund = tonumber(ARGV[4])
if refund ~= 0 then
  local now = tonumber(ARGV[1])
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
# KEYS: rpm, tpm, budget
# ARGV: now, rpm_cap, tpm_cap, requests, tokens, budget (-1: none), budget_ttl_s
DEBIT = (
    _BUCKET_LIB
    + """
local now = tonumber(ARGV[1])
local function charge(key, cap, amount)
  local level = load_bucket(key, cap, now)
  save_bucket(key, math.min(level, math.max(level - amount, -cap)), cap, now)
end
charge(KEYS[1], tonumber(ARGV[2]), tonumber(ARGV[4]))
charge(KEYS[2], tonumber(ARGV[3]), tonumber(ARGV[5]))
if tonumber(ARGV[6]) >= 0 then
  redis.call('INCRBY', KEYS[3], ARGV[5])
  redis.call('EXPIRE', KEYS[3], tonumber(ARGV[7]))
end
return 1
"""
)

# KEYS: conc; ARGV: lease_id, new_expiry, lease_ttl_ms
RENEW = """
if redis.call('ZSCORE', KEYS[1], ARGV[1]) == false then return 0 end
redis.call('ZADD', KEYS[1], tonumber(ARGV[2]), ARGV[1])
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[3]))
return 1
"""

-- Classic Redis token bucket (the "seed" design ringlimit is compared against).
--
-- KEYS[1]  bucket key
-- ARGV[1]  capacity (burst), tokens
-- ARGV[2]  refill rate, tokens per millisecond (limit / period_ms)
-- ARGV[3]  cost, default 1
-- ARGV[4]  optional "now" in ms; when absent the server clock (TIME) is used
--
-- Returns { allowed (1|0), remaining whole tokens }.
-- Uses TIME inside the script, which is fine with effect replication (default since Redis 5).

local key      = KEYS[1]
local capacity = tonumber(ARGV[1])
local rate     = tonumber(ARGV[2])
local cost     = tonumber(ARGV[3] or "1")

local now
if ARGV[4] then
  now = tonumber(ARGV[4])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
end

local state  = redis.call('HMGET', key, 'tokens', 'last_refill')
local tokens = tonumber(state[1])
local last   = tonumber(state[2])
if tokens == nil or last == nil then
  tokens = capacity
  last = now
end

local elapsed = now - last
if elapsed < 0 then elapsed = 0 end
tokens = math.min(capacity, tokens + elapsed * rate)

local allowed = 0
if tokens >= cost then
  tokens = tokens - cost
  allowed = 1
end

redis.call('HMSET', key, 'tokens', tokens, 'last_refill', now)
-- keep the key until the bucket would be full again (plus a second)
redis.call('EXPIRE', key, math.ceil(capacity / rate / 1000) + 1)

return { allowed, math.floor(tokens) }

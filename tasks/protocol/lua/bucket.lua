-- A client's token bucket (tasks/core/quota.py): `burst` tokens at once, refilled at
-- `rate` a second, kept in a hash {tokens, at}. Included by the scripts that begin
-- with "-- uses: bucket" (tasks/protocol/lua/__init__.py), so the rule is written once.

-- The tokens in the bucket at `now`.
local function bucket_tokens(key, rate, burst, now)
    local bucket = redis.call('HMGET', key, 'tokens', 'at')
    local tokens = tonumber(bucket[1]) or burst
    local at = tonumber(bucket[2]) or now
    if now > at then tokens = math.min(burst, tokens + (now - at) * rate) end
    return tokens
end

-- Store `tokens` as of `now`; the hash goes once it would be full again.
local function bucket_store(key, tokens, rate, burst, now)
    redis.call('HSET', key, 'tokens', tostring(tokens), 'at', tostring(now))
    redis.call('EXPIRE', key, math.ceil((burst - math.min(tokens, 0)) / rate) + 1)
end

-- Milliseconds until the bucket holds `n` tokens (0 when it does now).
local function bucket_wait_ms(tokens, rate, n)
    if tokens >= n then return 0 end
    return math.ceil((n - tokens) / rate * 1000)
end

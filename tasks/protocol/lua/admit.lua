-- uses: bucket
-- The edge admits a tier's requests, or none of them (tasks/store/request_queues.py::admit).
-- First the tier's cap, then, for requests with an owner, the owner's quota
-- (tasks/core/quota.py): its share of this tier, its requests in flight, its rate.
-- KEYS: queue, held hash, ledger, ledger payloads, wake token, the owner's rate bucket,
--       the owner's in-flight sets for each tier, the index of owners, the deadlines,
--       the tier's set of queued ids, then one owner key per request.
-- ARGV: 1 cap, 2 now, 3 an events message ('' for none), 4 owner ('' for none),
--       5 what an owner key holds, 6 rate per s, 7 burst, 8 most in flight,
--       9 this tier's share cap, 10 this tier's index among KEYS[7..9],
--       11 owner keys' expiry (s), 12 in-flight expiry (an absolute time),
--       13 the requests' deadline ('' for none), 14 how many topics, the topics, then
--       (id, message) pairs.
-- Returns {accepted, a count (depth before, or the owner's), refused by ('' when
-- accepted), retry after (ms)}. Safe to run twice for one call (see below).
local depth = redis.call('LLEN', KEYS[1]) + redis.call('HLEN', KEYS[2])
local now = tonumber(ARGV[2])
local owner = ARGV[4]
local ntopics = tonumber(ARGV[14])
local first = 15 + ntopics
local n = (#ARGV - first + 1) / 2
-- A second run of the same call (the client retried a command whose reply was lost)
-- leaves what the first run did: it admitted these requests if their first one is in
-- the ledger, or, answered meanwhile, still has its owner key. Request ids are fresh
-- for every call, so the first one marks the call.
if n > 0 and (redis.call('HEXISTS', KEYS[4], ARGV[first]) == 1
        or (owner ~= '' and redis.call('EXISTS', KEYS[13]) == 1)) then
    return {1, depth, '', 0}
end
if depth + n > tonumber(ARGV[1]) then
    return {0, depth, 'tier', 0}
end

local in_flight = KEYS[6 + tonumber(ARGV[10])]
if owner ~= '' then
    local total, mine = 0, 0
    for k = 7, 9 do
        -- Forget requests past their in-flight expiry: a lost answer cannot pin a quota.
        redis.call('ZREMRANGEBYSCORE', KEYS[k], '-inf', now)
        local c = redis.call('ZCARD', KEYS[k])
        total = total + c
        if KEYS[k] == in_flight then mine = c end
    end
    if mine + n > tonumber(ARGV[9]) then
        return {0, mine, 'share', 1000}
    end
    if total + n > tonumber(ARGV[8]) then
        return {0, total, 'in_flight', 1000}
    end
    local rate, burst = tonumber(ARGV[6]), tonumber(ARGV[7])
    local tokens = bucket_tokens(KEYS[6], rate, burst, now)
    local wait = bucket_wait_ms(tokens, rate, n)
    if wait > 0 then
        return {0, total, 'rate', wait}
    end
    bucket_store(KEYS[6], tokens - n, rate, burst, now)
end

local k = 13
local deadline = ARGV[13]
for i = first, #ARGV, 2 do
    redis.call('ZADD', KEYS[3], now, ARGV[i])
    redis.call('HSET', KEYS[4], ARGV[i], ARGV[i + 1])
    if deadline ~= '' then redis.call('ZADD', KEYS[11], deadline, ARGV[i]) end
    redis.call('LPUSH', KEYS[1], ARGV[i + 1])
    redis.call('SADD', KEYS[12], ARGV[i])
    if owner ~= '' then
        redis.call('SET', KEYS[k], ARGV[5], 'EX', ARGV[11])
        redis.call('ZADD', in_flight, ARGV[12], ARGV[i])
        k = k + 1
    end
end
if owner ~= '' then
    redis.call('ZADD', KEYS[10], now, owner)
    local ttl = math.ceil(tonumber(ARGV[12]) - now) + 1
    if redis.call('TTL', in_flight) < ttl then redis.call('EXPIRE', in_flight, ttl) end
end
redis.call('LPUSH', KEYS[5], 1)
redis.call('LTRIM', KEYS[5], 0, 0)
if ARGV[3] ~= '' then
    for t = 15, 14 + ntopics do
        redis.call('PUBLISH', ARGV[t], ARGV[3])
    end
end
return {1, depth, '', 0}

-- The edge admits a tier's requests, or none of them (tasks/store/request_queues.py::admit).
-- KEYS: queue, held hash, ledger, ledger payloads, wake token.
-- ARGV: cap, now, an events message ('' for none), how many topics, the topics, then
-- (id, message) pairs.
local depth = redis.call('LLEN', KEYS[1]) + redis.call('HLEN', KEYS[2])
local ntopics = tonumber(ARGV[4])
local first = 5 + ntopics
local n = (#ARGV - first + 1) / 2
if depth + n > tonumber(ARGV[1]) then
    return {0, depth}
end
for i = first, #ARGV, 2 do
    redis.call('ZADD', KEYS[3], ARGV[2], ARGV[i])
    redis.call('HSET', KEYS[4], ARGV[i], ARGV[i + 1])
    redis.call('LPUSH', KEYS[1], ARGV[i + 1])
end
redis.call('LPUSH', KEYS[5], 1)
redis.call('LTRIM', KEYS[5], 0, 0)
if ARGV[3] ~= '' then
    for t = 5, 4 + ntopics do
        redis.call('PUBLISH', ARGV[t], ARGV[3])
    end
end
return {1, depth}

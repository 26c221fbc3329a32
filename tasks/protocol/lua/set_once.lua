-- A request's one final outcome (tasks/store/outcomes.py). The ledger entry goes in either
-- case: the request has its one answer.
-- KEYS: result key, answers counters, ledger, ledger payloads, ledger attempts.
-- ARGV: meta, expiry, id.
redis.call('ZREM', KEYS[3], ARGV[3])
redis.call('HDEL', KEYS[4], ARGV[3])
redis.call('HDEL', KEYS[5], ARGV[3])
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'EX', ARGV[2]) then
    redis.call('PUBLISH', KEYS[1], ARGV[1])
    redis.call('HINCRBY', KEYS[2], 'first', 1)
    return 1
end
redis.call('HINCRBY', KEYS[2], 'refused', 1)
return 0

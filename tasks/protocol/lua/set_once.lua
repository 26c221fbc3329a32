-- uses: states
-- A request's one final outcome (tasks/store/outcomes.py). The ledger entry goes in either
-- case: the request has its one answer.
-- KEYS: result key, answers counters, ledger, ledger payloads, ledger attempts, owner key,
--       deadlines.
-- ARGV: meta, expiry, id, in-flight key prefix, reply lists' prefix.
redis.call('ZREM', KEYS[3], ARGV[3])
redis.call('HDEL', KEYS[4], ARGV[3])
redis.call('HDEL', KEYS[5], ARGV[3])
redis.call('ZREM', KEYS[7], ARGV[3])
-- An owned request leaves its owner's in-flight set either way: its answer may have been
-- stored by another writer first (Celery's own revoke handler stores REVOKED). The
-- set's name is built here, from the owner key's "<tier>|<owner>"
-- (tasks/protocol/names.py::in_flight_key): a single Redis, not a cluster, so a key not
-- declared in KEYS is safe.
local record = redis.call('GET', KEYS[6])
if record then
    local bar = string.find(record, '|', 1, true)
    redis.call('ZREM', ARGV[4] .. string.sub(record, bar + 1) .. ':' .. string.sub(record, 1, bar - 1), ARGV[3])
end
-- A final answer replaces only nothing, or the STARTED state its device stored when its
-- batch began (task_track_started; tasks/store/outcomes.py::started).
local stored = redis.call('SET', KEYS[1], ARGV[1], 'NX', 'EX', ARGV[2])
if not stored then
    local current = redis.call('GET', KEYS[1])
    if current and is_started(current) then
        stored = redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
    end
end
if stored then
    redis.call('PUBLISH', KEYS[1], ARGV[1])
    -- An id of version 8 belongs to a reply group (tasks/protocol/names.py::reply_key, the
    -- same rule): its answer also goes onto the group's list, where its caller pops it.
    if string.sub(ARGV[3], 15, 15) == '8' then
        local replies = ARGV[5] .. string.sub(ARGV[3], 1, 23)
        redis.call('RPUSH', replies, ARGV[1])
        redis.call('EXPIRE', replies, ARGV[2])
    end
    redis.call('HINCRBY', KEYS[2], 'first', 1)
    -- Who owns it is kept as long as its answer.
    if record then
        redis.call('EXPIRE', KEYS[6], ARGV[2])
    end
    return 1
end
redis.call('HINCRBY', KEYS[2], 'refused', 1)
return 0

-- The active collector's lease (tasks/store/lease.py). Its value is a fencing token,
-- "<epoch>:<nonce>": the epoch grows with every holder, and the acquirer's own nonce
-- makes the token unique even where the epoch's INCR was lost (the last second of the
-- append-only file, after a host crash): two holders never share a token, so every
-- script that moves requests, checking it, lets one of them through.
-- KEYS: lease, epoch. ARGV: 'acquire', ttl ms, nonce | 'renew', token, ttl ms |
-- 'release', token.
if ARGV[1] == 'acquire' then
    if redis.call('EXISTS', KEYS[1]) == 1 then
        return 0
    end
    local token = redis.call('INCR', KEYS[2]) .. ':' .. ARGV[3]
    redis.call('SET', KEYS[1], token, 'PX', ARGV[2])
    return token
end
if redis.call('GET', KEYS[1]) ~= ARGV[2] then
    return 0
end
if ARGV[1] == 'renew' then
    redis.call('PEXPIRE', KEYS[1], ARGV[3])
else
    redis.call('DEL', KEYS[1])
end
return 1

-- The active collector's lease (tasks/store/lease.py). Its value is a fencing token:
-- every later token is larger, and every script that moves requests checks it.
-- KEYS: lease, epoch. ARGV: 'acquire', ttl ms | 'renew', token, ttl ms | 'release', token.
if ARGV[1] == 'acquire' then
    if redis.call('EXISTS', KEYS[1]) == 1 then
        return 0
    end
    local token = redis.call('INCR', KEYS[2])
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

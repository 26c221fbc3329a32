-- uses: states
-- The active collector takes up to its window per tier into the held hashes, and drains
-- the device events, in one call (tasks/store/request_queues.py::take); nothing at all
-- (false) unless it still holds the lease.
-- KEYS: the three queues, their three held hashes, the wake token, the events queue, the lease,
--       the three sets of queued ids (struck off here as their messages are taken).
-- ARGV: the window, the fencing token, the result keys' prefix.
-- A message whose request already has its answer (revoked while queued, or answered
-- DeadlineExceeded by the deadline sweep) is dropped here: it never runs. Its id comes
-- back (the fifth list) for the collector to strike its ledger entry and free its
-- owner's slot (tasks/protocol/lua/set_once.lua, refused, does both).
if redis.call('GET', KEYS[9]) ~= ARGV[2] then
    return false
end
redis.call('DEL', KEYS[7])
-- STARTED (task_track_started) is no answer: a request its device began may be queued
-- again (the ledger sweep), and must be taken.
local out = {}
local dropped = {}
for t = 1, 3 do
    local got = {}
    local room = tonumber(ARGV[1]) - redis.call('HLEN', KEYS[3 + t])
    if room > 0 then
        local raws = redis.call('RPOP', KEYS[t], room)
        if raws then
            for _, raw in ipairs(raws) do
                local ok, m = pcall(cjson.decode, raw)
                if ok and type(m) == 'table' and type(m['headers']) == 'table'
                        and type(m['headers']['id']) == 'string' then
                    redis.call('SREM', KEYS[9 + t], m['headers']['id'])
                    local answer = redis.call('GET', ARGV[3] .. m['headers']['id'])
                    if not answer or is_started(answer) then
                        redis.call('HSET', KEYS[3 + t], m['headers']['id'], raw)
                        got[#got + 1] = raw
                    else
                        dropped[#dropped + 1] = m['headers']['id']
                    end
                else
                    got[#got + 1] = raw
                end
            end
        end
    end
    out[t] = got
end
local events = redis.call('LRANGE', KEYS[8], 0, -1)
if #events > 0 then
    redis.call('DEL', KEYS[8])
end
out[4] = events
out[5] = dropped
return out

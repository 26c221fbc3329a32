-- The active collector hands work on (tasks/store/request_queues.py::dispatch), and only
-- while it holds the lease: push each batch's task message, strike its requests off the
-- held hashes, touch their ledger entries, set a round's chord size and publish the
-- task-sent events, all at once or not at all. With no message it only strikes requests
-- off (they have their outcome).
-- KEYS: lease, ledger, held high, held normal, held low, the round's chord-size key (the
-- lease key again when there is no round), then one queue per message.
-- ARGV: fencing token, now, chord size (0: no round), chord-size expiry in s (0: none),
-- events message ('' for none), how many topics, the topics, then one message per queue
-- key, then (tier index 1-3, request id) pairs. Safe to run twice for one call (below).
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
    return 0
end
local nmessages = #KEYS - 6
local ntopics = tonumber(ARGV[6])
local first = 7 + ntopics
-- A second run of the same call (the client retried a command whose reply was lost):
-- the first run struck its requests off the held hashes, so a batch whose first request
-- is no longer held has been pushed already, and must not be pushed again.
local items = first + nmessages
if nmessages > 0 and items < #ARGV
        and redis.call('HEXISTS', KEYS[2 + tonumber(ARGV[items])], ARGV[items + 1]) == 0 then
    return 1
end
if tonumber(ARGV[3]) > 0 then
    if tonumber(ARGV[4]) > 0 then
        redis.call('SET', KEYS[6], ARGV[3], 'EX', ARGV[4])
    else
        redis.call('SET', KEYS[6], ARGV[3])
    end
end
for i = 1, nmessages do
    redis.call('LPUSH', KEYS[6 + i], ARGV[first + i - 1])
end
for i = first + nmessages, #ARGV, 2 do
    redis.call('HDEL', KEYS[2 + tonumber(ARGV[i])], ARGV[i + 1])
    redis.call('ZADD', KEYS[2], 'XX', ARGV[2], ARGV[i + 1])
end
if ARGV[5] ~= '' then
    for t = 7, 6 + ntopics do
        redis.call('PUBLISH', ARGV[t], ARGV[5])
    end
end
return 1

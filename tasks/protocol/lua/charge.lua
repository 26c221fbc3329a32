-- uses: bucket
-- Charge a client's token bucket outside admission (tasks/store/request_queues.py::charge).
-- KEYS: the bucket. ARGV: 1 rate per s, 2 burst, 3 n, 4 now, 5 mode:
--   'take':  take n tokens if the bucket holds them (a rate limit on a call);
--   'spend': take n whatever it holds, down to -burst at most (work that was refused
--            after it was done: invalid inputs cost their caller as accepted ones do).
-- Returns the milliseconds until the bucket holds one token again ('take': until it
-- holds n, and nothing taken), 0 when it does now.
local rate, burst, n, now = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local tokens = bucket_tokens(KEYS[1], rate, burst, now)
if ARGV[5] == 'take' then
    local wait = bucket_wait_ms(tokens, rate, n)
    if wait > 0 then return wait end
    bucket_store(KEYS[1], tokens - n, rate, burst, now)
    return 0
end
tokens = math.max(-burst, tokens - n)
bucket_store(KEYS[1], tokens, rate, burst, now)
return bucket_wait_ms(tokens, rate, 1)

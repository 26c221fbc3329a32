-- What a stored Celery result says, for the scripts that begin with "-- uses: states".

-- STARTED (task_track_started; tasks/store/outcomes.py::started) is no answer yet: a
-- final answer may replace it, and a request whose result says so may still be taken.
local function is_started(raw)
    local ok, meta = pcall(cjson.decode, raw)
    return ok and type(meta) == 'table' and meta['status'] == 'STARTED'
end

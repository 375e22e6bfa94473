-- wrk script: POST /v1/check/batch with BATCH keys never seen before in each request (a key
-- flood: every check makes a new bucket).
--
--   wrk -t1 -c16 -d20s -s bench/wrk/flood.lua http://127.0.0.1:PORT
--
-- Env: BATCH (default 100) keys a request.

local batch = tonumber(os.getenv("BATCH") or "100")
local headers = { ["Content-Type"] = "application/json" }
local threads = {}
local nthreads = 0

function setup(thread)
   nthreads = nthreads + 1
   thread:set("id", nthreads)
   table.insert(threads, thread)
end

function init(args)
   n, sent, other = 0, 0, 0
end

function request()
   local parts = {}
   for i = 1, batch do
      n = n + 1
      parts[i] = '{"key":"flood:' .. id .. ':' .. n .. '","limit":10,"period_ms":60000}'
   end
   sent = sent + batch
   return wrk.format("POST", "/v1/check/batch", headers,
                     '{"checks":[' .. table.concat(parts, ",") .. ']}')
end

function response(status, hdrs, body)
   if status ~= 200 then
      other = other + 1
      if other <= 3 then
         io.stderr:write("unexpected status " .. status .. ": " .. tostring(body) .. "\n")
      end
   end
end

function done(summary, latency, requests)
   local s, o = 0, 0
   for _, t in ipairs(threads) do
      s = s + (t:get("sent") or 0)
      o = o + (t:get("other") or 0)
   end
   io.write(string.format("ringlimit-flood: keys=%d bad_responses=%d\n", s, o))
end

-- wrk script: POST /v1/check/batch with BATCH_SIZE checks per request.
--
--   wrk -t2 -c8 -d10s -s bench/wrk/batch.lua http://127.0.0.1:PORT
--
-- Env:
--   BATCH_SIZE       checks per request (default 1000, the API maximum)
--   BATCH_BODIES     distinct prebuilt bodies per wrk thread, used round-robin (default 8)
--   KEYSPACE         number of distinct keys (default 100000)
--   CHECK_LIMIT      inline token-bucket limit (default 100)
--   CHECK_PERIOD_MS  inline token-bucket period (default 1000)
--   SAMPLE_EVERY     inspect one response body in this many for the allowed/denied mix
--                    (default 50; scanning every ~100 KB body would steal CPU from the server
--                    on a 2-core machine)
--
-- Bodies are built once per thread in init() with random keys, so the load generator spends
-- its time sending, not building JSON. checks/s = Requests/sec x BATCH_SIZE.

local batch_size = tonumber(os.getenv("BATCH_SIZE") or "1000")
local nbodies    = tonumber(os.getenv("BATCH_BODIES") or "8")
local keyspace   = tonumber(os.getenv("KEYSPACE") or "100000")
local limit      = tonumber(os.getenv("CHECK_LIMIT") or "100")
local period     = tonumber(os.getenv("CHECK_PERIOD_MS") or "1000")
local sample_every = tonumber(os.getenv("SAMPLE_EVERY") or "50")

local headers = { ["Content-Type"] = "application/json" }

local threads = {}
local nthreads = 0

function setup(thread)
   nthreads = nthreads + 1
   thread:set("id", nthreads)
   table.insert(threads, thread)
end

local requests_ = {}
local next_req = 1

function init(args)
   math.randomseed(os.time() + (id or 0) * 104729)
   local suffix = string.format('","limit":%d,"period_ms":%d,"algorithm":"token_bucket"}', limit, period)
   for b = 1, nbodies do
      local items = {}
      for i = 1, batch_size do
         items[i] = '{"key":"user:' .. math.random(0, keyspace - 1) .. suffix
      end
      local body = '{"checks":[' .. table.concat(items, ",") .. ']}'
      requests_[b] = wrk.format("POST", "/v1/check/batch", headers, body)
   end
   ok, bad, seen = 0, 0, 0
   s_allowed, s_denied, s_error = 0, 0, 0
end

function request()
   local r = requests_[next_req]
   next_req = next_req % nbodies + 1
   return r
end

function response(status, hdrs, body)
   if status == 200 then ok = ok + 1 else
      bad = bad + 1
      if bad <= 3 then
         io.stderr:write("unexpected status " .. status .. ": " .. string.sub(tostring(body), 1, 300) .. "\n")
      end
   end
   seen = seen + 1
   if seen % sample_every == 1 and body then
      local _, a = string.gsub(body, '"allowed":true', "")
      local _, d = string.gsub(body, '"allowed":false', "")
      local _, e = string.gsub(body, '"error":', "")
      s_allowed, s_denied, s_error = s_allowed + a, s_denied + d, s_error + e
   end
end

function done(summary, latency, requests)
   local o, b, a, d, e = 0, 0, 0, 0, 0
   for _, t in ipairs(threads) do
      o = o + (t:get("ok") or 0)
      b = b + (t:get("bad") or 0)
      a = a + (t:get("s_allowed") or 0)
      d = d + (t:get("s_denied") or 0)
      e = e + (t:get("s_error") or 0)
   end
   local pct = 0
   if a + d + e > 0 then pct = 100 * a / (a + d + e) end
   io.write(string.format("ringlimit-batch: batch_size=%d http_200=%d http_other=%d " ..
                          "sampled_items_allowed=%d denied=%d error=%d allowed_pct=%.2f\n",
                          batch_size, o, b, a, d, e, pct))
end

-- wrk script: one POST /v1/check per request with a named rule, random key from a small set.
--
--   RULE=hot-global KEYSPACE=100 wrk -t2 -c8 -d10s -s bench/wrk/named.lua http://127.0.0.1:PORT
--
-- Env (read once per wrk Lua state):
--   RULE      the configured rule to name (default "hot-global")
--   KEYSPACE  number of distinct keys, "hot:0" .. (default 100)
--
-- Counts 200 / 429 / other per thread and sums them in done(), like check.lua.

local rule     = os.getenv("RULE") or "hot-global"
local keyspace = tonumber(os.getenv("KEYSPACE") or "100")

local headers = { ["Content-Type"] = "application/json" }
local prefix  = '{"key":"hot:'
local suffix  = string.format('","rule":"%s"}', rule)

local threads = {}
local nthreads = 0

function setup(thread)
   nthreads = nthreads + 1
   thread:set("id", nthreads)
   table.insert(threads, thread)
end

function init(args)
   math.randomseed(os.time() + (id or 0) * 7919)
   allowed, denied, other = 0, 0, 0
end

function request()
   local body = prefix .. math.random(0, keyspace - 1) .. suffix
   return wrk.format("POST", "/v1/check", headers, body)
end

function response(status, hdrs, body)
   if status == 200 then
      allowed = allowed + 1
   elseif status == 429 then
      denied = denied + 1
   else
      other = other + 1
      if other <= 3 then
         io.stderr:write("unexpected status " .. status .. ": " .. tostring(body) .. "\n")
      end
   end
end

function done(summary, latency, requests)
   local a, d, o = 0, 0, 0
   for _, t in ipairs(threads) do
      a = a + (t:get("allowed") or 0)
      d = d + (t:get("denied") or 0)
      o = o + (t:get("other") or 0)
   end
   local total = a + d + o
   local pct = 0
   if total > 0 then pct = 100 * a / total end
   io.write(string.format("ringlimit-named: rule=%s allowed_200=%d denied_429=%d other=%d allowed_pct=%.2f\n",
                          rule, a, d, o, pct))
end

-- wrk script: one POST /v1/check per request, random key per request; an inline token-bucket
-- rule, or the configured rule named by RULE.
--
--   wrk -t2 -c32 -d10s -s bench/wrk/check.lua http://127.0.0.1:PORT
--
-- Env (read once per wrk Lua state):
--   KEYSPACE         number of distinct keys (default 100000)
--   CHECK_LIMIT      inline token-bucket limit (default 100)
--   CHECK_PERIOD_MS  inline token-bucket period (default 1000)
--   RULE             name a configured rule instead of the inline one (e.g. hot-global)
--   KEY_PREFIX       keys are KEY_PREFIX .. n (default "user:")
--   CONNECTION_CLOSE 1: every request says `Connection: close`, so each check is a new
--                    connection (wrk reconnects), a new TLS handshake over https (bench/tls.sh)
--
-- Each wrk thread runs its own Lua state, so the allowed/denied counters are per-thread
-- globals; setup() keeps a handle on every thread and done() (which runs in the main state)
-- sums them with thread:get().

local keyspace = tonumber(os.getenv("KEYSPACE") or "100000")
local limit    = tonumber(os.getenv("CHECK_LIMIT") or "100")
local period   = tonumber(os.getenv("CHECK_PERIOD_MS") or "1000")

local headers = { ["Content-Type"] = "application/json" }
if os.getenv("CONNECTION_CLOSE") == "1" then
   headers["Connection"] = "close"
end
local rule     = os.getenv("RULE")
local prefix  = '{"key":"' .. (os.getenv("KEY_PREFIX") or "user:")
local suffix
if rule then
   suffix = string.format('","rule":"%s"}', rule)
else
   suffix = string.format('","limit":%d,"period_ms":%d,"algorithm":"token_bucket","cost":1}',
                          limit, period)
end

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
   io.write(string.format("ringlimit-checks: allowed_200=%d denied_429=%d other=%d allowed_pct=%.2f\n",
                          a, d, o, pct))
end

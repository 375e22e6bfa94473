-- wrk script: one request held to three limits (per user, per IP, per endpoint), either as one
-- POST /v1/check/all (MODE=all) or as three POST /v1/check calls (MODE=three: each wrk request
-- is one of the three calls, in turn; a request of three limits is three of them).
--
--   MODE=all wrk -t2 -c8 -d10s -s bench/wrk/all.lua http://127.0.0.1:PORT
--
-- Env: MODE (all | three), KEYSPACE (distinct users and IPs, default 100000). The rules
-- `per-user` and `per-ip` must be configured (bench/all.sh writes them).

local mode     = os.getenv("MODE") or "all"
local keyspace = tonumber(os.getenv("KEYSPACE") or "100000")
local headers  = { ["Content-Type"] = "application/json" }
local threads  = {}

function setup(thread)
   table.insert(threads, thread)
   thread:set("id", #threads)
end

function init(args)
   math.randomseed(os.time() + (id or 0) * 7919)
   allowed, denied, other, turn = 0, 0, 0, 0
end

local function user() return '{"key":"user:' .. math.random(0, keyspace - 1) .. '","rule":"per-user"}' end
local function ip() return '{"key":"ip:' .. math.random(0, keyspace - 1) .. '","rule":"per-ip"}' end
local endpoint = '{"key":"POST /orders","limit":1000000,"period_ms":1000}'

function request()
   if mode == "all" then
      return wrk.format("POST", "/v1/check/all", headers,
                        '{"checks":[' .. user() .. ',' .. ip() .. ',' .. endpoint .. ']}')
   end
   turn = turn % 3 + 1
   local body = (turn == 1 and user()) or (turn == 2 and ip()) or endpoint
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
   io.write(string.format("ringlimit-all: allowed_200=%d denied_429=%d other=%d\n", a, d, o))
end

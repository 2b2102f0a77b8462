-- wrk script for scripts/bench.sh: KEYS rotating API keys, requests formatted once; prints the BENCH line of report.lua.
local n = tonumber(os.getenv("BENCH_KEYS") or "1000")
local requests = {}
local i = 0
function init(args)
  for k = 1, n do
    requests[k] = wrk.format("GET", "/", {
      ["Host"] = wrk.headers["Host"],
      ["X-API-Key"] = string.format("bench-key-%04d", k),
    })
  end
end
function request()
  i = i % n + 1
  return requests[i]
end
-- The BENCH line, from report.lua beside this file.
dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "report.lua")

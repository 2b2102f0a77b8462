-- wrk script for scripts/bench-cache.sh: riders polling 20 hot reads (/api/surge/zone/0..19)
-- with 2,000 rotating API keys, requests formatted once; prints the BENCH line of report.lua.
local keys = tonumber(os.getenv("BENCH_KEYS") or "2000")
local zones = tonumber(os.getenv("BENCH_ZONES") or "20")
local requests = {}
local i = 0
function init(args)
  for k = 1, keys do
    requests[k] = wrk.format("GET", string.format("/api/surge/zone/%d", k % zones), {
      ["Host"] = wrk.headers["Host"],
      ["X-API-Key"] = string.format("rider-%04d", k),
    })
  end
end
function request()
  i = i % keys + 1
  return requests[i]
end
dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "report.lua")

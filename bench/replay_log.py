"""Writes N lines of floodgate's JSON access-log format to stdout, for scripts/bench-replay.sh:
10,000 API keys (as SHA-256 digests, as floodgate logs them) and 5,000 client IPs, one hour of
traffic in time order."""

import hashlib
import random
import sys

n = int(sys.argv[1])
rng = random.Random(7)
keys = [hashlib.sha256(b"key-%d" % k).hexdigest() for k in range(10_000)]
ips = ["10.%d.%d.%d" % (i >> 16 & 255, i >> 8 & 255, i & 255) for i in range(5_000)]
start = 1_795_305_600_000_000  # 2026-11-22T00:00:00Z in µs
span = 3_600_000_000
out = sys.stdout
template = ('{"timestamp":"2026-11-22T%02d:%02d:%02d.%06dZ","level":"INFO","fields":{"message":'
            '"request done","route":"api","status":200},"target":"floodgate::access","span":'
            '{"client_ip":"%s","decision":"allowed","identity":"api_key","identity_hash":"%s",'
            '"latency_ms":1.25,"method":"POST","path":"/api/rides/request","route":"api",'
            '"status":200,"name":"request"}}\n')
lines = []
for i in range(n):
    t = i * span // n
    secs, micros = divmod(t, 1_000_000)
    lines.append(template % (secs // 3600, secs // 60 % 60, secs % 60, micros,
                             ips[rng.randrange(5_000)], keys[rng.randrange(10_000)]))
    if len(lines) == 10_000:
        out.write("".join(lines))
        lines.clear()
out.write("".join(lines))

# Dockerfile for floodgate: builds the proxy (floodgate) and the demo API (floodgate-demo-upstream) in a
# Rust builder stage, then ships both, stripped, in a slim Debian image that runs as uid 10001.
#
#   docker build -t floodgate .
#   docker run -e FLOODGATE_UPSTREAM=http://api.internal:9000 -p 8080:8080 -p 9090:9090 floodgate
#
# The baked-in config (config/floodgate.standalone.yaml, at /etc/floodgate/floodgate.yaml) runs on the
# in-memory store in front of FLOODGATE_UPSTREAM, one token bucket per client (FLOODGATE_BURST,
# FLOODGATE_RATE); FLOODGATE_STORE=redis with FLOODGATE_REDIS_URL shares budgets in Redis. Mount a
# directory of your own over /etc/floodgate for anything more (it must be readable by uid 10001).
# `docker run IMAGE check --config FILE` validates a file; docker-compose.yml runs the full demo stack
# and reuses this image for the demo upstream by overriding the entrypoint.

FROM rust:1-bookworm AS builder
WORKDIR /src
# The image is built with the `dist` profile (release with whole-program optimisation, as the
# benchmarks measure). Cargo.toml keeps debug info for profiling; the image ships none.
ENV CARGO_PROFILE_DIST_DEBUG=0 \
    CARGO_PROFILE_DIST_STRIP=symbols

# 1. The dependencies, in a layer of their own: only the manifests and the lock file are copied, and
#    every target is a stub, so this layer is rebuilt only when Cargo.toml or Cargo.lock change (as
#    cargo-chef's recipe does, with nothing to install).
COPY Cargo.toml Cargo.lock ./
COPY demo-upstream/Cargo.toml demo-upstream/
RUN mkdir -p src benches bench demo-upstream/src \
 && echo 'fn main() {}' > src/main.rs && touch src/lib.rs \
 && for example in $(awk '/^\[\[example\]\]/ {e = 1; next} e && /^path *=/ {gsub(/^path *= *"|"$/, ""); print; e = 0}' Cargo.toml); do \
      echo 'fn main() {}' > "$example"; \
    done \
 && echo 'fn main() {}' > demo-upstream/src/main.rs \
 && for bench in $(awk '/^\[\[bench\]\]/ {b = 1; next} b && /^name *=/ {gsub(/^name *= *"|"$/, ""); print; b = 0}' Cargo.toml); do \
      echo 'fn main() {}' > "benches/$bench.rs"; \
    done \
 && cargo build --profile dist --locked --workspace --bins \
 && rm -rf src benches bench demo-upstream/src

# 2. floodgate itself. The sources are touched so cargo sees them newer than the stubs it built.
COPY . .
RUN find src demo-upstream/src -name '*.rs' -exec touch {} + \
 && cargo build --profile dist --locked --workspace --bins \
 && install -D -m 0755 -t /out target/dist/floodgate target/dist/floodgate-demo-upstream

FROM debian:bookworm-slim
# ca-certificates: HTTPS upstreams and rediss://; curl: the HEALTHCHECKs.
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates curl \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 floodgate \
 && useradd --system --uid 10001 --gid floodgate --no-create-home --shell /usr/sbin/nologin floodgate
COPY --from=builder /out/floodgate /out/floodgate-demo-upstream /usr/local/bin/
COPY config/floodgate.standalone.yaml /etc/floodgate/floodgate.yaml
USER floodgate:floodgate
# 8080: proxy listener; 9090: admin listener (/healthz, /readyz, /metrics).
EXPOSE 8080 9090
# Liveness only: /healthz answers while the process serves, whether or not Redis or the upstream
# can be reached (that is /readyz, which an orchestrator's readiness probe should use instead: a
# container restarted for a Redis outage would only lose its in-process fallback).
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
  CMD curl -fsS -o /dev/null http://127.0.0.1:9090/healthz || exit 1
STOPSIGNAL SIGTERM
ENTRYPOINT ["floodgate"]
CMD ["--config", "/etc/floodgate/floodgate.yaml"]

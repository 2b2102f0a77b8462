# Dockerfile for floodgate: builds the proxy (floodgate) and the demo API (floodgate-demo-upstream) in a
# Rust builder stage, then ships both in a slim Debian image that runs as a non-root user.
#
#   docker build -t floodgate .
#   docker run -v "$PWD/config:/etc/floodgate:ro" -p 8080:8080 -p 9090:9090 floodgate \
#       --config /etc/floodgate/floodgate.docker.yaml
#
# The entrypoint is `floodgate`; the default command is `--config /etc/floodgate/floodgate.yaml`, so
# `docker run IMAGE` runs the proxy with the baked-in config and `docker run IMAGE check --config FILE`
# validates a file. docker-compose.yml reuses this image for the demo upstream by overriding the entrypoint.

FROM rust:1-bookworm AS builder
WORKDIR /src
# The whole workspace (see .dockerignore): both packages, the lock file, and whatever targets Cargo.toml names.
COPY . .
RUN cargo build --release --locked --workspace --bins \
 && install -D -m 0755 -t /out target/release/floodgate target/release/floodgate-demo-upstream

FROM debian:bookworm-slim
# ca-certificates: HTTPS upstreams and rediss://; curl: the HEALTHCHECKs.
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates curl \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 floodgate \
 && useradd --system --uid 10001 --gid floodgate --no-create-home --shell /usr/sbin/nologin floodgate
COPY --from=builder /out/floodgate /out/floodgate-demo-upstream /usr/local/bin/
# A default config; mount a directory over /etc/floodgate to replace it.
COPY config/floodgate.docker.yaml /etc/floodgate/floodgate.yaml
USER floodgate:floodgate
# 8080: proxy listener; 9090: admin listener (/healthz, /readyz, /metrics), as in the bundled config.
EXPOSE 8080 9090
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
  CMD curl -fsS -o /dev/null http://127.0.0.1:9090/healthz || exit 1
STOPSIGNAL SIGTERM
ENTRYPOINT ["floodgate"]
CMD ["--config", "/etc/floodgate/floodgate.yaml"]

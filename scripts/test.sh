#!/usr/bin/env bash
# Runs the whole test suite (sets up ./.venv on first use). Extra arguments go to pytest.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup_env.sh" test
cd "$root"
# The repository's own bytecode, once: with PYTHONDONTWRITEBYTECODE set, each test's subprocess would compile it.
"$root/.venv/bin/python" -m compileall -q grpo_jax tests scripts benchmarks experiments > /dev/null
# Three workers on a 2-core VM: a worker waiting on its subprocesses (a trainer it kills, a Ray cluster, a poll)
# leaves its core to the third (whole suite, pytest's time: 14:48 with two workers, 13:08 with three).
exec "$root/.venv/bin/python" -m pytest -q -n 3 --dist loadfile --no-loadscope-reorder "$@"

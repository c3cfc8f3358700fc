#!/usr/bin/env bash
# Creates ./.venv on first use and (re)installs the package with its test extras whenever setup.cfg or
# constraints.txt changes.
# Sourced by scripts/run_default.sh and scripts/test.sh; safe to run by hand.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv"
stamp="$venv/.grpo_jax_installed"
want="$(cat "$root/setup.cfg" "$root/pyproject.toml" "$root/constraints.txt" | sha256sum | cut -d' ' -f1)"
if [ ! -x "$venv/bin/python" ]; then
  echo "[setup] creating $venv" >&2
  "${PYTHON:-python3}" -m venv "$venv"
fi
if [ "$(cat "$stamp" 2>/dev/null || true)" != "$want" ]; then
  echo "[setup] installing grpo_jax and its dependencies into $venv (first run takes a few minutes)" >&2
  "$venv/bin/python" -m pip install -q --upgrade pip >&2
  # torch==2.13.0 (CPU build, pinned in the test extra) is only used by tests as a reference implementation.
  # constraints.txt: the exact versions this repository was tested with (setup.cfg declares ranges).
  "$venv/bin/python" -m pip install -q -c "$root/constraints.txt" -e "$root[test]" >&2
  echo "$want" > "$stamp"
fi

#!/usr/bin/env bash
# Runs the default experiment (sets up ./.venv on first use). Extra arguments go to scripts/train.py.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup_env.sh"
cd "$root"
exec "$root/.venv/bin/python" scripts/train.py --config experiments/default.py --workdir "${WORKDIR:-runs/default}" "$@"

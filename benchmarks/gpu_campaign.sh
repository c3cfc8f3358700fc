#!/usr/bin/env bash
# The accelerator campaign in one call (issue 45; benchmarks/gpu_campaign.py says what each part measures).
#
# On a GPU machine whose image has jax (CUDA), flax, optax, orbax, torch and transformers, from the repo root:
#   bash benchmarks/gpu_campaign.sh              # results in $OUT (default /tmp/gpu_campaign)
# What the image lacks travels as wheels in .whl/ (ignored by git), fetched once where pip reaches PyPI:
#   bash benchmarks/gpu_campaign.sh --fetch-wheels
# Extra arguments go to gpu_campaign.py (--budget S, --only a,b).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

# Pure-Python wheels for Python 3.12: grpo_jax's missing dependencies and TRL 1.16 with its own.
WHEELS=(ml_collections==1.1.0 tensorboardX==2.6.5 trl==1.16.0 datasets==4.8.5 dill==0.4.1
        multiprocess==0.70.19)

if [[ "${1:-}" == "--fetch-wheels" ]]; then
  mkdir -p .whl
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform any -d .whl "${WHEELS[@]}"
  ls .whl
  exit 0
fi

if compgen -G ".whl/*.whl" > /dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
# grpo_jax from this checkout, installed or not (the image has its dependencies, .whl/ the rest).
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gpu_campaign}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$OUT/nvidia_smi.txt" 2>&1 || true
exec "$PY" benchmarks/gpu_campaign.py --out "$OUT" "$@"

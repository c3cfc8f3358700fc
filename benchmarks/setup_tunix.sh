#!/usr/bin/env bash
# Creates ./.venv-tunix for the Tunix side of the benchmarks (benchmarks/tunix_grpo.py): google-tunix 0.1.7 has
# pins of its own (orbax, grain, qwix, tensorflow_datasets...) that do not belong in grpo_jax's environment.
# jax, flax, optax and numpy are held at the versions of constraints.txt, so both sides run the same XLA (transformers is left to Tunix: its safetensors<0.8 pin excludes ours).
#   bash benchmarks/setup_tunix.sh
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv-tunix"
if [ ! -x "$venv/bin/python" ]; then
  "${PYTHON:-python3}" -m venv "$venv"
fi
pins="$(grep -E '^(jax|jaxlib|flax|numpy|optax)==' "$root/constraints.txt")"
"$venv/bin/python" -m pip install -q --upgrade pip
# shellcheck disable=SC2086
"$venv/bin/python" -m pip install -q "google-tunix==0.1.7" $pins
"$venv/bin/python" -c "import tunix, jax, flax; print('tunix 0.1.7 with jax', jax.__version__, 'flax', flax.__version__)"

#!/usr/bin/env bash
# Creates ./.venv on first use and (re)installs the package whenever setup.cfg or constraints.txt changes.
#   bash scripts/setup_env.sh        # what training needs (scripts/run_default.sh)
#   bash scripts/setup_env.sh test   # and the test extra: pytest, torch and transformers' references (scripts/test.sh)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv"
stamp="$venv/.grpo_jax_installed"
want="$(cat "$root/setup.cfg" "$root/pyproject.toml" "$root/constraints.txt" | sha256sum | cut -d' ' -f1)"
if [ ! -x "$venv/bin/python" ]; then
  echo "[setup] creating $venv" >&2
  "${PYTHON:-python3}" -m venv "$venv"
fi
extra="${1:-}"
have="$(cat "$stamp" 2>/dev/null || true)"
# Installed already: this extra, or the test extra (a superset of the bare install).
if [ "$have" != "$want $extra" ] && [ "$have" != "$want test" ]; then
  echo "[setup] installing grpo_jax${extra:+ [$extra]} and its dependencies into $venv (first run takes a few minutes)" >&2
  "$venv/bin/python" -m pip install -q --upgrade pip >&2
  # torch (the test extra: the tests' reference implementation) in its CPU build: PyPI's Linux wheel of torch
  # 2.13.0 is the CUDA 13 build (several GB of nvidia-* wheels); PyTorch's CPU index has 2.13.0+cpu, the version
  # constraints.txt pins. From that index torch alone (--no-deps): its dependencies come from PyPI below.
  if [[ ",$extra," == *",test,"* ]]; then
    echo "[setup] torch's CPU build from PyTorch's index" >&2
    # One retry: where that index is out of reach, a local wheel (PIP_FIND_LINKS) is found without pip's backoff.
    "$venv/bin/python" -m pip install --progress-bar on --no-deps --retries 1 -c "$root/constraints.txt" \
      --index-url https://download.pytorch.org/whl/cpu torch >&2
  fi
  # constraints.txt: the exact versions this repository was tested with (setup.cfg declares ranges). uv (a pinned
  # wheel) installs them, in a third of pip's time (benchmarks/README.md). It reads pip's PIP_FIND_LINKS (a
  # machine's local wheels), not pip's config files; pip takes over if uv fails. Bytecode is compiled at install,
  # as pip does: where PYTHONDONTWRITEBYTECODE is set, every test's subprocess would compile jax's sources again.
  "$venv/bin/python" -m pip install -q -c "$root/constraints.txt" uv >&2
  links=()
  for dir in ${PIP_FIND_LINKS:-}; do links+=(--find-links "$dir"); done
  if ! "$venv/bin/uv" pip install --compile-bytecode --python "$venv/bin/python" -c "$root/constraints.txt" "${links[@]}" \
      -e "$root${extra:+[$extra]}" >&2; then
    echo "[setup] uv failed: installing with pip" >&2
    # Not -q: pip's lines (Collecting / Downloading with a bar / Installing) show what the minutes go to.
    "$venv/bin/python" -m pip install --progress-bar on -c "$root/constraints.txt" -e "$root${extra:+[$extra]}" >&2
  fi
  echo "$want $extra" > "$stamp"
fi

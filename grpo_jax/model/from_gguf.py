"""A GGUF file (a package registry's way to ship a model) -> a float32 Hugging Face directory `model.hf_path` reads.

transformers' GGUF loader dequantizes every tensor to float32, but refuses `save_pretrained` on the model it
loaded, so the weights go through a fresh model built from the same config (its quantization entry dropped).
Needs torch, transformers, `gguf` and `accelerate` (scripts/get_smollm2.py and scripts/get_gemma3.py install
them). The weights are the quantized ones, dequantized: close to, not equal to, the original release.
"""
from __future__ import annotations

import argparse
import os
from typing import Callable


def convert(gguf_file: str, out: str, *, check: Callable | None = None, chat_template: str | None = None) -> str:
  """Writes the directory for `gguf_file` into `out` (a temporary directory renamed at the end, so `out` is whole
  or absent). `check(config, model, gguf_file)` may raise on what the GGUF got wrong; `chat_template` is used when
  the GGUF carries none (without either, a tokenizer with no chat template is an error)."""
  import torch
  import transformers

  directory, name = os.path.split(gguf_file)
  tokenizer = transformers.AutoTokenizer.from_pretrained(directory, gguf_file=name)
  gguf_model = transformers.AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=torch.float32)
  config = gguf_model.config
  if hasattr(config, "quantization_config"):
    del config.quantization_config
  model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
  missing, unexpected = model.load_state_dict(gguf_model.state_dict(), strict=False)
  # A tied output matrix is the embedding itself: it may be absent from the GGUF's state dict.
  missing = [k for k in missing if not (config.tie_word_embeddings and k == "lm_head.weight")]
  if missing or unexpected:
    raise RuntimeError(f"weights do not match the config: missing {missing}, unexpected {unexpected}")
  model.tie_weights()
  if check is not None:
    check(config, model, gguf_file)
  if not tokenizer.chat_template:
    if chat_template is None:
      raise RuntimeError(f"{gguf_file}: the tokenizer has no chat template")
    tokenizer.chat_template = chat_template
  staging = out.rstrip("/") + ".partial"
  model.save_pretrained(staging, safe_serialization=True)
  tokenizer.save_pretrained(staging)
  if os.path.exists(out):
    raise FileExistsError(f"{out} appeared while converting; remove it and run again")
  os.rename(staging, out)
  return out


def main(prog: str, description: str, default_out: str, gguf_path: Callable[[], str], argv=None, **kwargs) -> None:
  """The command line of scripts/get_*.py: `--out DIR` (default `default_out`); nothing to do when DIR holds a
  config.json; else `convert(gguf_path(), DIR, **kwargs)`."""
  parser = argparse.ArgumentParser(prog=prog, description=description)
  parser.add_argument("--out", default=default_out, help=f"output directory (default {default_out})")
  args = parser.parse_args(argv)
  if os.path.exists(os.path.join(args.out, "config.json")):
    print(f"[{prog}] {args.out} already exists; nothing to do")
    return
  out = convert(gguf_path(), os.path.abspath(args.out), **kwargs)
  print(f"[{prog}] wrote {out}: use --config.model.hf_path={out}")

#!/usr/bin/env python
"""Gemma 3 on this machine's accelerator: logits and greedy decoding against transformers' PyTorch model, in
float32 and in bfloat16, on random weights with the widths of Gemma 3 1B and 4B (2 layers: sliding, global).

  python -m benchmarks.gemma3_precision                     # on a GPU: both sides on the GPU
  python -m benchmarks.gemma3_precision --shapes tiny       # a quick run on a CPU

For each shape it prints, on left-padded prompts of 40, 23 and 9 tokens (sliding window 16):
  float32   max |logit difference| ours vs transformers (matmuls at full float32 precision on both sides:
            JAX's "highest", torch without TF32), and whether 64 greedy tokens are identical;
  bfloat16  bfloat16 weights and compute on both sides: each side's max |logit error| against the float32
            logits of transformers, ours against transformers', the share of positions whose argmax agrees,
            and how many of 64 greedy tokens agree before the first difference (per prompt);
  sampler   bfloat16: max |log-prob difference| between the sampler's cached decode and the training path's
            forward over the same completion (what the importance ratio sees at the first update).
Numbers only: nothing is asserted (bfloat16 rounding differs between the two libraries' kernels).
"""
from __future__ import annotations

import argparse
import json
import tempfile

import jax
import numpy as np
from flax import nnx

from grpo_jax.model import hf_io
from grpo_jax.model.logprobs import completion_logprobs
from grpo_jax.sampling import Sampler, SamplingConfig
from tests.model.test_gemma3 import (F_, S_, build_torch_gemma, jax_logits, left_padded,
                                     torch_greedy, torch_logits)

LENGTHS, TOTAL, NEW = (40, 23, 9), 40, 64


def _jax_sample(model, prompts):
  graphdef, state = nnx.split(model)
  sampler = Sampler(graphdef, SamplingConfig(max_new_tokens=NEW, greedy=True, pad_id=0), prompt_bucket_min=8)
  return state, graphdef, sampler.generate(state, prompts, jax.random.key(0))


def _agree_prefix(a, b):
  """Per row: how many leading tokens are equal."""
  same = np.asarray(a) == np.asarray(b)
  return [int(np.argmin(row)) if not row.all() else len(row) for row in same]


def check(shape: str, vocab: int, device: str) -> dict:
  import torch
  torch.backends.cuda.matmul.allow_tf32 = False
  torch.backends.cudnn.allow_tf32 = False
  torch_model = build_torch_gemma(shape, (S_, F_), 16, vocab=vocab)
  tokens, mask = left_padded(np.random.default_rng(1), LENGTHS, TOTAL, vocab=vocab)
  prompts = [list(row[m]) for row, m in zip(tokens, mask)]
  out: dict = {"shape": shape, "vocab": vocab, "jax_device": str(jax.devices()[0]), "torch_device": device}
  with tempfile.TemporaryDirectory() as path:
    torch_model.save_pretrained(path)
    torch_model = torch_model.to(device)
    ref32 = torch_logits(torch_model, tokens, mask)
    m = mask.astype(bool)
    with jax.default_matmul_precision("highest"):
      ours32_model = hf_io.from_pretrained(path)
      ours32 = jax_logits(ours32_model, tokens, mask)
      _, _, greedy32 = _jax_sample(ours32_model, prompts)
    out["float32_max_abs_logit_diff"] = float(np.abs(ours32[m] - ref32[m]).max())
    out["float32_max_abs_logit"] = float(np.abs(ref32[m]).max())
    out["float32_greedy_equal"] = bool((greedy32.completion_BxC == torch_greedy(torch_model, prompts, NEW)).all())

    ours16_model = hf_io.from_pretrained(path, param_dtype="bfloat16", dtype="bfloat16")
    ours16 = jax_logits(ours16_model, tokens, mask)
    torch16 = torch_model.to(torch.bfloat16)
    ref16 = torch_logits(torch16, tokens, mask)
    out["bf16_ours_vs_f32_max_abs"] = float(np.abs(ours16[m] - ref32[m]).max())
    out["bf16_torch_vs_f32_max_abs"] = float(np.abs(ref16[m] - ref32[m]).max())
    out["bf16_ours_vs_torch_max_abs"] = float(np.abs(ours16[m] - ref16[m]).max())
    out["bf16_argmax_agree"] = float((ours16[m].argmax(-1) == ref16[m].argmax(-1)).mean())
    state, graphdef, greedy16 = _jax_sample(ours16_model, prompts)
    out["bf16_greedy_agree_prefix"] = _agree_prefix(greedy16.completion_BxC, torch_greedy(torch16, prompts, NEW))

    # The sampler's cached decode against the training path's forward over the same completion, bfloat16 (the
    # prompts are the rows of `tokens`, left padded to the longest).
    c, cm = greedy16.completion_BxC, greedy16.completion_mask_BxC.astype(bool)
    logp = jax.jit(lambda s, *a: completion_logprobs(nnx.merge(graphdef, s), *a)[0])(state, tokens, mask, c, cm)
    out["bf16_sampler_vs_training_logp_max_abs"] = float(np.abs(np.asarray(logp)[cm] - greedy16.logp_BxC[cm]).max())
  return out


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--shapes", default="1b,4b", help="comma-separated: 1b, 4b, tiny (tests/model/test_gemma3.py)")
  parser.add_argument("--vocab", type=int, default=4096)
  parser.add_argument("--out", default=None, help="also write the results here as JSON lines")
  args = parser.parse_args(argv)
  import torch
  device = "cuda" if torch.cuda.is_available() else "cpu"
  print(f"jax {jax.__version__} on {jax.devices()[0].device_kind}; torch {torch.__version__} on {device}", flush=True)
  for shape in args.shapes.split(","):
    result = check(shape, args.vocab, device)
    print(json.dumps(result), flush=True)
    if args.out:
      with open(args.out, "a") as f:
        f.write(json.dumps(result) + "\n")


if __name__ == "__main__":
  main()

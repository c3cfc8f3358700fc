"""Shape bucketing, so that a run compiles a handful of sampler programs rather than one per call.

A size n is rounded up to a power of two (at least `minimum`) while that stays <= `linear_step`, and to a
multiple of `linear_step` beyond: padding waste is < 2x for small sizes and < `linear_step` for large ones.
"""
from __future__ import annotations

import numpy as np


def bucket_size(n: int, minimum: int = 1, linear_step: int = 128) -> int:
  if n < 1:
    raise ValueError(f"bucket_size: n={n} must be >= 1")
  if n > linear_step:
    return -(-n // linear_step) * linear_step
  b = max(minimum, 1)
  while b < n:
    b *= 2
  return b


def left_pad(prompts: list[list[int]], length: int, rows: int, pad_id: int):
  """Left-pads token lists into (tokens_BxP int32, mask_BxP int32) with B=rows >= len(prompts).

  Rows past len(prompts) are dummy rows holding a single pad token (mask 1, so that their attention is
  well defined); the caller discards them.
  """
  tokens = np.full((rows, length), pad_id, np.int32)
  mask = np.zeros((rows, length), np.int32)
  for i, p in enumerate(prompts):
    tokens[i, length - len(p):] = p
    mask[i, length - len(p):] = 1
  mask[len(prompts):, -1] = 1
  return tokens, mask

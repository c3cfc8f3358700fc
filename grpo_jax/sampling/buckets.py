"""Shape bucketing, so that a run compiles a handful of sampler programs rather than one per call.

A size n is rounded up, from `minimum`, along powers of two and the midpoints 1.5 x 2^k between them
(16, 24, 32, 48, 64, 96, 128, ...) while that stays <= `linear_step`, and to a multiple of `linear_step`
beyond: padding waste is < 1.5x for small sizes and < `linear_step` for large ones, for twice as many
buckets as powers of two alone (with those, 24-token prompts were padded to 32: a third more prefill work).
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
    # From a power of two (>= 4) to its 1.5x midpoint, otherwise on to the next power of two.
    b = b * 3 // 2 if b >= 4 and b & (b - 1) == 0 else 1 << b.bit_length()
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

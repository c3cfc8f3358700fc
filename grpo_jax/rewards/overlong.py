"""DAPO's soft overlong punishment (docs/algorithms.md §6) as a reward term.

With L_max the generation limit and B the buffer, a completion of L tokens gets
    0                               if L <= L_max - B
    -(L - (L_max - B)) / B * factor if L_max - B < L <= L_max   (a linear ramp from 0 down to -factor)
    -factor                         if L > L_max
"""
from __future__ import annotations

import numpy as np


def soft_overlong_penalty(lengths_N, max_length: int, buffer: int, factor: float = 1.0) -> np.ndarray:
  """[N] float32 penalties (<= 0) for completion lengths [N] in tokens."""
  if not 0 < buffer <= max_length:
    raise ValueError(f"need 0 < buffer <= max_length, got buffer={buffer}, max_length={max_length}")
  lengths_N = np.asarray(lengths_N, np.float64)
  ramp = -(lengths_N - (max_length - buffer)) / buffer * factor
  return np.clip(np.minimum(ramp, 0.0), -factor, 0.0).astype(np.float32)


def make_overlong_reward(max_length: int, buffer: int, factor: float = 1.0,
                         length_column: str = "completion_length"):
  """A reward fn reading token lengths from the column `length_column` (the trainer passes the sampler's
  lengths there), so the penalty can be combined with the others in `score_completions`."""
  soft_overlong_penalty([0], max_length, buffer, factor)  # validates the arguments now, not at step 1

  def overlong_penalty(prompts: list[str], completions: list[str], **columns) -> list[float]:
    del prompts
    if length_column not in columns:
      raise KeyError(f"overlong penalty needs the token lengths in column {length_column!r}; got columns "
                     f"{sorted(columns)}")
    lengths = columns[length_column]
    if len(lengths) != len(completions):
      raise ValueError(f"{len(lengths)} lengths for {len(completions)} completions")
    return soft_overlong_penalty(lengths, max_length, buffer, factor).tolist()

  return overlong_penalty

"""DAPO's soft overlong punishment (docs/algorithms.md §6) as a reward term.

With C_max the generation limit (the papers' L_max) and `buffer` tokens, a completion of |o| tokens gets
    0                                              if |o| <= C_max - buffer
    -(|o| - (C_max - buffer)) / buffer * factor    if C_max - buffer < |o| <= C_max   (a ramp from 0 to -factor)
    -factor                                        if |o| > C_max
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


class OverlongPenalty:
  """A reward fn reading token lengths from the column `length_column` (the trainer passes the sampler's
  lengths there), so the penalty can be combined with the others in `score_completions`. (A class, not a
  closure, so that the reward worker process can rebuild it.)"""

  __name__ = "overlong_penalty"

  def __init__(self, max_length: int, buffer: int, factor: float = 1.0, length_column: str = "completion_length"):
    soft_overlong_penalty([0], max_length, buffer, factor)  # validates the arguments now, not at step 1
    self.max_length, self.buffer, self.factor, self.length_column = max_length, buffer, factor, length_column

  def __call__(self, prompts: list[str], completions: list[str], **columns) -> list[float]:
    del prompts
    if self.length_column not in columns:
      raise KeyError(f"overlong penalty needs the token lengths in column {self.length_column!r}; got columns "
                     f"{sorted(columns)}")
    lengths = columns[self.length_column]
    if len(lengths) != len(completions):
      raise ValueError(f"{len(lengths)} lengths for {len(completions)} completions")
    return soft_overlong_penalty(lengths, self.max_length, self.buffer, self.factor).tolist()


make_overlong_reward = OverlongPenalty

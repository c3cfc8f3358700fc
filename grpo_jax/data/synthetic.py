"""Synthetic tasks with verifiable answers, generated on the fly (nothing to download).

A task offers `tokenizer`, `train_rows(start, n)` and `eval_rows(n)`, each returning columns as lists:
`{"prompt": [...], "answer": [...]}` (the reward functions receive the columns other than "prompt").
Training row i depends only on (seed, i), so the data position (the index of the next row) is all a
checkpoint needs to resume the stream. Held-out problems are a fixed hash-defined subset of all problems,
never produced by `train_rows`, and the same for every seed.
"""
from __future__ import annotations

import numpy as np

from grpo_jax.data.char_tokenizer import CharTokenizer

_MASK64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def _splitmix64(x: np.ndarray) -> np.ndarray:
  """A well-mixed 64-bit hash of each uint64 (SplitMix64 finalizer)."""
  with np.errstate(over="ignore"):
    x = (x + np.uint64(0x9E3779B97F4A7C15)) & _MASK64
    x = ((x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)) & _MASK64
    x = ((x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)) & _MASK64
    return x ^ (x >> np.uint64(31))


def _hash(*parts) -> np.ndarray:
  h = np.zeros(np.broadcast(*[np.asarray(p) for p in parts]).shape, np.uint64)
  for p in parts:
    h = _splitmix64(h ^ np.asarray(p).astype(np.uint64))
  return h


class AdditionTask:
  """"a+b=" -> "c" with 0 <= a, b < 10**num_digits (operands are written without leading zeros)."""

  name = "addition"
  _TRAIN, _EVAL, _SPLIT = 1, 2, 3  # hash stream ids.

  def __init__(self, num_digits: int = 2, heldout_fraction: float = 0.1, seed: int = 0):
    if num_digits < 1:
      raise ValueError(f"AdditionTask: num_digits must be >= 1, got {num_digits}")
    if not 0 < heldout_fraction < 1:
      raise ValueError(f"AdditionTask: heldout_fraction must be in (0, 1), got {heldout_fraction}")
    self.num_digits = num_digits
    self.heldout_fraction = heldout_fraction
    self.seed = seed
    self.tokenizer = CharTokenizer("0123456789+=")
    self._n = 10 ** num_digits

  @property
  def max_prompt_chars(self) -> int:
    return 2 * self.num_digits + 2

  @property
  def max_answer_chars(self) -> int:
    return self.num_digits + 1

  def is_heldout(self, a, b) -> np.ndarray:
    u = _hash(self._SPLIT, a, b).astype(np.float64) / 2.0 ** 64
    return u < self.heldout_fraction

  def _pairs(self, stream: int, seed: int, idx: np.ndarray, attempt: int):
    a = (_hash(stream, seed, idx, attempt, 0) % np.uint64(self._n)).astype(np.int64)
    b = (_hash(stream, seed, idx, attempt, 1) % np.uint64(self._n)).astype(np.int64)
    return a, b

  def _columns(self, a, b) -> dict[str, list[str]]:
    return {"prompt": [f"{x}+{y}=" for x, y in zip(a, b)], "answer": [str(x + y) for x, y in zip(a, b)]}

  def train_rows(self, start: int, n: int) -> dict[str, list[str]]:
    """Rows start .. start+n-1 of this seed's endless training stream (held-out problems are skipped)."""
    idx = np.arange(start, start + n, dtype=np.uint64)
    a, b = self._pairs(self._TRAIN, self.seed, idx, 0)
    attempt = 0
    while True:
      bad = self.is_heldout(a, b)
      if not bad.any():
        break
      attempt += 1
      a2, b2 = self._pairs(self._TRAIN, self.seed, idx, attempt)
      a, b = np.where(bad, a2, a), np.where(bad, b2, b)
    return self._columns(a.tolist(), b.tolist())

  def eval_rows(self, n: int) -> dict[str, list[str]]:
    """The first n distinct held-out problems (the same for every seed)."""
    total = self._n * self._n
    heldout_total = None
    if total <= 4_000_000:
      a, b = np.divmod(np.arange(total, dtype=np.int64), self._n)
      keep = self.is_heldout(a, b)
      heldout_total = int(keep.sum())
      if n > heldout_total:
        raise ValueError(f"AdditionTask: eval size {n} exceeds the {heldout_total} held-out problems "
                         f"(num_digits={self.num_digits}, heldout_fraction={self.heldout_fraction})")
      a, b = a[keep], b[keep]
      order = np.argsort(_hash(self._EVAL, a, b), kind="stable")[:n]
      return self._columns(a[order].tolist(), b[order].tolist())
    pairs: dict[tuple[int, int], None] = {}
    start = 0
    while len(pairs) < n:
      idx = np.arange(start, start + 16 * n, dtype=np.uint64)
      a, b = self._pairs(self._EVAL, 0, idx, 0)
      keep = self.is_heldout(a, b)
      for x, y in zip(a[keep].tolist(), b[keep].tolist()):
        pairs.setdefault((x, y))
      start += 16 * n
    chosen = list(pairs)[:n]
    return self._columns([x for x, _ in chosen], [y for _, y in chosen])


def make_task(task_config, seed: int):
  """The task named by `config.task`."""
  if task_config.name == "addition":
    return AdditionTask(task_config.num_digits, task_config.heldout_fraction, seed)
  raise ValueError(f"config.task.name: unknown task {task_config.name!r} (known: addition)")

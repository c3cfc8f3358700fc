"""Synthetic tasks with verifiable answers, generated on the fly (nothing to download); what a task offers:
grpo_jax/data/tasks.py. Held-out problems are a fixed hash-defined subset of all problems, never produced by
`train_rows`, and the same for every seed.
"""
from __future__ import annotations

import numpy as np

from grpo_jax.config_checks import Section, fail
from grpo_jax.data.char_tokenizer import CharTokenizer
from grpo_jax.data.tasks import no_tokenizer, register_task

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


def _train_pairs(task, idx: np.ndarray) -> tuple[list[int], list[int]]:
  """The operand pairs of training rows `idx` of an AdditionTask or ToolArithmeticTask: a held-out pair is drawn
  again (the next attempt's hash) until none is left."""
  a, b = task._pairs(task._TRAIN, task.seed, idx, 0)
  attempt = 0
  while (bad := task.is_heldout(a, b)).any():
    attempt += 1
    a2, b2 = task._pairs(task._TRAIN, task.seed, idx, attempt)
    a, b = np.where(bad, a2, a), np.where(bad, b2, b)
  return a.tolist(), b.tolist()


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
    return _hash(self._SPLIT, a, b).astype(np.float64) / 2.0 ** 64 < self.heldout_fraction

  def _pairs(self, stream: int, seed: int, idx: np.ndarray, attempt: int):
    return tuple((_hash(stream, seed, idx, attempt, j) % np.uint64(self._n)).astype(np.int64) for j in (0, 1))

  def _columns(self, a, b) -> dict[str, list[str]]:
    return {"prompt": [f"{x}+{y}=" for x, y in zip(a, b)], "answer": [str(x + y) for x, y in zip(a, b)]}

  def train_rows(self, start: int, n: int) -> dict[str, list[str]]:
    """Rows start .. start+n-1 of this seed's endless training stream (held-out problems are skipped)."""
    return self._columns(*_train_pairs(self, np.arange(start, start + n, dtype=np.uint64)))

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


class ToolArithmeticTask:
  """"37*48=" -> "1776": products of two 2-digit numbers, which a small model cannot work out in its head but can
  get from the calculator environment (grpo_jax/envs/calculator.py): "37*48?" -> "[1776]" -> "1776". The warm
  start imitates `demonstration`: for a `tool_fraction` of the rows (hash-chosen) the tool-using episode, as
  segments [text, trained] (the observation is context, not a target), for the others the bare product.
  """

  name = "tool_arithmetic"
  _TRAIN, _EVAL, _SPLIT, _STYLE = 21, 22, 23, 24  # hash stream ids.
  LOW, HIGH = 10, 100                               # operands in [LOW, HIGH)

  def __init__(self, heldout_fraction: float = 0.1, seed: int = 0, tool_fraction: float = 0.5):
    if not 0 < heldout_fraction < 1:
      raise ValueError(f"ToolArithmeticTask: heldout_fraction must be in (0, 1), got {heldout_fraction}")
    if not 0 <= tool_fraction <= 1:
      raise ValueError(f"ToolArithmeticTask: tool_fraction must be in [0, 1], got {tool_fraction}")
    self.heldout_fraction, self.seed, self.tool_fraction = heldout_fraction, seed, tool_fraction
    self.tokenizer = CharTokenizer("0123456789+-*=?[]")

  max_prompt_chars = 6    # "99*99="
  max_answer_chars = 4    # "9801"
  max_episode_chars = 17  # "99*99?" + "[9801]" + "9801" and the stop token

  def is_heldout(self, a, b) -> np.ndarray:
    return _hash(self._SPLIT, a, b).astype(np.float64) / 2.0 ** 64 < self.heldout_fraction

  def _pairs(self, stream: int, seed: int, idx: np.ndarray, attempt: int):
    span = np.uint64(self.HIGH - self.LOW)
    return tuple((self.LOW + (_hash(stream, seed, idx, attempt, j) % span)).astype(np.int64) for j in (0, 1))

  def _columns(self, a, b, tool) -> dict[str, list]:
    prompts = [f"{x}*{y}=" for x, y in zip(a, b)]
    answers = [str(x * y) for x, y in zip(a, b)]
    demos = [[[f"{x}*{y}?", 1], [f"[{x * y}]", 0], [str(x * y), 1]] if t else [[str(x * y), 1]]
             for x, y, t in zip(a, b, tool)]
    return {"prompt": prompts, "answer": answers, "demonstration": demos}

  def _tool(self, stream: int, idx: np.ndarray) -> np.ndarray:
    return (_hash(self._STYLE, stream, self.seed, idx).astype(np.float64) / 2.0 ** 64) < self.tool_fraction

  def train_rows(self, start: int, n: int) -> dict[str, list]:
    """Rows start .. start+n-1 of this seed's endless training stream (held-out problems are skipped)."""
    idx = np.arange(start, start + n, dtype=np.uint64)
    return self._columns(*_train_pairs(self, idx), self._tool(self._TRAIN, idx))

  def eval_rows(self, n: int) -> dict[str, list]:
    """The first n held-out problems in a fixed hash order (the same for every seed)."""
    a, b = np.divmod(np.arange((self.HIGH - self.LOW) ** 2, dtype=np.int64), self.HIGH - self.LOW)
    a, b = a + self.LOW, b + self.LOW
    keep = self.is_heldout(a, b)
    if n > int(keep.sum()):
      raise ValueError(f"ToolArithmeticTask: eval size {n} exceeds the {int(keep.sum())} held-out problems")
    a, b = a[keep], b[keep]
    order = np.argsort(_hash(self._EVAL, a, b), kind="stable")[:n]
    return self._columns(a[order].tolist(), b[order].tolist(), self._tool(self._EVAL, np.arange(n, dtype=np.uint64)))


class ChainSumTask:
  """"4+7+2+9=" -> "22": the sum of `min_terms`..`max_terms` single digits, which the model may work out in
  writing: the answer is the last comma-separated field of the completion, so "11,13,22" (the running sums)
  and "22" (the sum alone) both score. Completions run from 2 to about 3 (max_terms - 1) characters, and how
  long they are is up to the policy, which is what length normalisation and clipping act on
  (docs/ablations.md). The warm start imitates `demonstration`: the running sums for a `scratchpad_fraction`
  of the rows (hash-chosen), the bare sum for the others.
  """

  name = "chain_sum"
  _TRAIN, _EVAL, _SPLIT, _TERMS, _STYLE = 11, 12, 13, 14, 15  # hash stream ids.

  def __init__(self, min_terms: int = 3, max_terms: int = 8, heldout_fraction: float = 0.1, seed: int = 0,
               scratchpad_fraction: float = 0.5):
    if not 2 <= min_terms <= max_terms <= 12:
      raise ValueError(f"ChainSumTask: need 2 <= min_terms <= max_terms <= 12, got {min_terms}, {max_terms}")
    if not 0 < heldout_fraction < 1:
      raise ValueError(f"ChainSumTask: heldout_fraction must be in (0, 1), got {heldout_fraction}")
    if not 0 <= scratchpad_fraction <= 1:
      raise ValueError(f"ChainSumTask: scratchpad_fraction must be in [0, 1], got {scratchpad_fraction}")
    self.min_terms, self.max_terms = min_terms, max_terms
    self.heldout_fraction, self.seed, self.scratchpad_fraction = heldout_fraction, seed, scratchpad_fraction
    self.tokenizer = CharTokenizer("0123456789+=,")

  @property
  def max_prompt_chars(self) -> int:
    return 2 * self.max_terms

  @property
  def max_answer_chars(self) -> int:
    """The longest demonstration: max_terms - 1 running sums of at most 3 digits, comma-separated."""
    return (self.max_terms - 1) * (len(str(9 * self.max_terms)) + 1) - 1

  def _terms(self, stream: int, seed: int, idx: np.ndarray, attempt: int) -> list[list[int]]:
    span = self.max_terms - self.min_terms + 1
    counts = self.min_terms + (_hash(self._TERMS, stream, seed, idx, attempt) % np.uint64(span)).astype(np.int64)
    digits = np.stack([(_hash(stream, seed, idx, attempt, j) % np.uint64(10)).astype(np.int64)
                       for j in range(self.max_terms)], axis=1)
    return [row[:k].tolist() for row, k in zip(digits, counts)]

  def is_heldout(self, terms: list[int]) -> bool:
    code = int("".join(map(str, terms))) * 16 + len(terms)  # distinct for distinct digit lists
    return float(_hash(self._SPLIT, code)) / 2.0 ** 64 < self.heldout_fraction

  def _rows(self, chains: list[list[int]], styles: np.ndarray) -> dict[str, list[str]]:
    prompts, answers, demos = [], [], []
    for terms, scratch in zip(chains, styles):
      sums = np.cumsum(terms)[1:].tolist()
      prompts.append("+".join(map(str, terms)) + "=")
      answers.append(str(sums[-1]))
      demos.append(",".join(map(str, sums)) if scratch else str(sums[-1]))
    return {"prompt": prompts, "answer": answers, "demonstration": demos}

  def _styles(self, stream: int, idx: np.ndarray) -> np.ndarray:
    return (_hash(self._STYLE, stream, self.seed, idx).astype(np.float64) / 2.0 ** 64) < self.scratchpad_fraction

  def train_rows(self, start: int, n: int) -> dict[str, list[str]]:
    """Rows start .. start+n-1 of this seed's endless training stream (held-out chains are skipped)."""
    idx = np.arange(start, start + n, dtype=np.uint64)
    chains = self._terms(self._TRAIN, self.seed, idx, 0)
    attempt = 0
    while bad := [i for i, terms in enumerate(chains) if self.is_heldout(terms)]:
      attempt += 1
      for i, terms in zip(bad, self._terms(self._TRAIN, self.seed, idx[bad], attempt)):
        chains[i] = terms
    return self._rows(chains, self._styles(self._TRAIN, idx))

  def eval_rows(self, n: int) -> dict[str, list[str]]:
    """The first n distinct held-out chains (the same for every seed)."""
    chains: dict[tuple[int, ...], None] = {}
    start = 0
    while len(chains) < n:
      idx = np.arange(start, start + 16 * n, dtype=np.uint64)
      for terms in self._terms(self._EVAL, 0, idx, 0):
        if self.is_heldout(terms):
          chains.setdefault(tuple(terms))
      start += 16 * n
    chosen = [list(c) for c in list(chains)[:n]]
    return self._rows(chosen, self._styles(self._EVAL, np.arange(n, dtype=np.uint64)))


# --- The generated tasks as plug-ins (grpo_jax/data/tasks.py) -------------------------------------------------------

def _check_chain_sum(settings, in_memory_dataset: bool) -> None:
  del in_memory_dataset
  t, s = settings.task, Section(settings.task, "task")
  if not 2 <= t.min_terms <= t.max_terms <= 12:
    s.fail("min_terms", f"chain_sum needs 2 <= task.min_terms <= task.max_terms <= 12 (task.max_terms="
           f"{t.max_terms})")
  s.within("scratchpad_fraction", 0, 1)
  if settings.model.hf_path:
    fail("model.hf_path", "the chain_sum task uses its own character tokenizer; leave it empty", settings.model.hf_path)
  task = ChainSumTask(t.min_terms, t.max_terms)
  sampling = Section(settings.sampling, "sampling")
  if sampling["max_prompt_length"] < task.max_prompt_chars:
    sampling.fail("max_prompt_length", f"shorter than the longest chain_sum prompt ({task.max_prompt_chars} "
                  f"characters at task.max_terms={t.max_terms})")
  if sampling["max_new_tokens"] < task.max_answer_chars + 1:
    sampling.fail("max_new_tokens", f"cannot hold the longest written-out answer and its stop token "
                  f"({task.max_answer_chars + 1} at task.max_terms={t.max_terms})")


def _check_tool_arithmetic(settings, in_memory_dataset: bool) -> None:
  del in_memory_dataset
  Section(settings.task, "task").within("tool_fraction", 0, 1)


@register_task("addition", takes=("num_digits", "heldout_fraction"))
def _addition(settings, tokenizer, log):
  t = settings.task
  task = AdditionTask(t.num_digits, t.heldout_fraction, settings.seed)
  if tokenizer is not None:
    task.tokenizer = tokenizer
  return task


@register_task("chain_sum", check=_check_chain_sum,
               takes=("min_terms", "max_terms", "scratchpad_fraction", "heldout_fraction"))
def _chain_sum(settings, tokenizer, log):
  t = settings.task
  no_tokenizer("chain_sum", tokenizer)
  return ChainSumTask(t.min_terms, t.max_terms, t.heldout_fraction, settings.seed, t.scratchpad_fraction)


@register_task("tool_arithmetic", check=_check_tool_arithmetic, takes=("tool_fraction", "heldout_fraction"))
def _tool_arithmetic(settings, tokenizer, log):
  t = settings.task
  no_tokenizer("tool_arithmetic", tokenizer)
  return ToolArithmeticTask(t.heldout_fraction, settings.seed, t.tool_fraction)

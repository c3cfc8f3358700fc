"""Format rewards for the R1 layout `<think>…</think><answer>…</answer>`, and format-gated accuracy.

strict:  the completion (surrounding whitespace ignored) is exactly one think block followed by one answer
         block, separated only by whitespace, nothing before or after, each tag used once, answer not blank.
lenient: somewhere in the completion a think block is followed (later) by a non-blank answer block.
answer_tag: the completion holds a complete, non-blank <answer> </answer> pair (no <think> asked for: chat
         models told to put the answer in tags, e.g. reasoning-gym tasks).

With the R1-Zero template the prompt already ends in "<think>", so the completion starts inside the think
block: pass `think_prefilled=True` to `make_format_reward`, which then checks "<think>" + completion.

Additive format rewards invite reward hacking (a model can collect the format bonus with wrong answers);
`gate_on_format` is the safer option: the accuracy score counts only when the format is right.
"""
from __future__ import annotations

import re
from typing import Callable

from grpo_jax.rewards.answers import answer_tag_content
from grpo_jax.rewards.registry import get_reward, register_reward

_STRICT_RE = re.compile(r"\s*<think>(?P<think>.*?)</think>\s*<answer>(?P<answer>.*?)</answer>\s*", re.DOTALL)
_TAGS = ("<think>", "</think>", "<answer>", "</answer>")


def strict_format_ok(completion: str) -> bool:
  # Counting first keeps the regex linear: with each tag once, its lazy groups have one way to match.
  if not all(completion.count(tag) == 1 for tag in _TAGS):
    return False
  m = _STRICT_RE.fullmatch(completion)
  return m is not None and bool(m.group("answer").strip())


def lenient_format_ok(completion: str) -> bool:
  # str.find scans, linear in the length: a regex `<think>.*?</think>.*?<answer>(.*?)</answer>` backtracks
  # cubically on completions of many unclosed tags, holding the GIL for minutes on 100k characters.
  think = completion.find("<think>")
  close = completion.find("</think>", think + len("<think>")) if think >= 0 else -1
  if close < 0:
    return False
  pos = close + len("</think>")
  while (start := completion.find("<answer>", pos)) >= 0:
    end = completion.find("</answer>", start + len("<answer>"))
    if end < 0:
      return False
    if completion[start + len("<answer>"):end].strip():
      return True
    pos = end + len("</answer>")
  return False


def make_format_reward(strict: bool = True, think_prefilled: bool = False):
  """A reward fn giving 1.0 to completions in the format (strict or lenient), else 0.0."""
  check = strict_format_ok if strict else lenient_format_ok
  prefix = "<think>" if think_prefilled else ""

  def format_reward(prompts: list[str], completions: list[str], **unused_columns) -> list[float]:
    del prompts, unused_columns
    return [float(check(prefix + c)) for c in completions]

  format_reward.__name__ = f"format_{'strict' if strict else 'lenient'}{'_prefilled' if think_prefilled else ''}"
  return format_reward


format_strict = register_reward("format_strict")(make_format_reward(strict=True))
format_lenient = register_reward("format_lenient")(make_format_reward(strict=False))
format_strict_prefilled = register_reward("format_strict_prefilled")(
    make_format_reward(strict=True, think_prefilled=True))
format_lenient_prefilled = register_reward("format_lenient_prefilled")(
    make_format_reward(strict=False, think_prefilled=True))


@register_reward("answer_tag")
def answer_tag(prompts: list[str], completions: list[str], **unused_columns) -> list[float]:
  """1.0 when the last complete <answer> </answer> pair of the completion is not blank, else 0.0."""
  del prompts, unused_columns
  return [float(bool((answer_tag_content(c) or "").strip())) for c in completions]


class gate_on_format:  # pylint: disable=invalid-name  (used as a function: a reward built from two others)
  """A new reward fn: the accuracy score where the format score is 1.0, `otherwise` elsewhere.

  `None` (not applicable) from the accuracy fn passes through unchanged. A class rather than a closure, so that
  the reward worker process can rebuild it (`grpo_jax.rewards.isolation`) when both rewards are names or
  module-level functions.
  """

  def __init__(self, accuracy_fn: Callable | str, format_fn: Callable | str = "format_strict",
               otherwise: float = 0.0):
    get_reward(accuracy_fn), get_reward(format_fn)   # an unknown name fails here, not at the first step
    self.accuracy_fn, self.format_fn, self.otherwise = accuracy_fn, format_fn, otherwise
    name = accuracy_fn if isinstance(accuracy_fn, str) else getattr(accuracy_fn, "__name__", "reward")
    self.__name__ = f"{name}_gated"

  def __setstate__(self, state):
    # Rebuilt in the reward worker: a name registered only in the trainer (e.g. from a notebook) fails here, so
    # the scorer runs this reward in a thread instead of counting every call as a failure.
    get_reward(state["accuracy_fn"]), get_reward(state["format_fn"])
    self.__dict__.update(state)

  def __call__(self, prompts: list[str], completions: list[str], **columns) -> list[float | None]:
    formats = get_reward(self.format_fn)(prompts, completions, **columns)
    scores = get_reward(self.accuracy_fn)(prompts, completions, **columns)
    if len(formats) != len(completions) or len(scores) != len(completions):
      raise ValueError(f"gated reward: got {len(scores)} accuracy and {len(formats)} format scores for "
                       f"{len(completions)} completions")
    return [s if (f == 1.0 or s is None) else self.otherwise for s, f in zip(scores, formats)]

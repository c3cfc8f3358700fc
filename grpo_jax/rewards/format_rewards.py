"""Format rewards for the R1 layout `<think>…</think><answer>…</answer>`, and format-gated accuracy.

strict:  the completion (surrounding whitespace ignored) is exactly one think block followed by one answer
         block, separated only by whitespace, nothing before or after, each tag used once, answer not blank.
lenient: somewhere in the completion a think block is followed (later) by a non-blank answer block.

With the R1-Zero template the prompt already ends in "<think>", so the completion starts inside the think
block: pass `think_prefilled=True` to `make_format_reward`, which then checks "<think>" + completion.

Additive format rewards invite reward hacking (a model can collect the format bonus with wrong answers);
`gate_on_format` is the safer option: the accuracy score counts only when the format is right.
"""
from __future__ import annotations

import re
from typing import Callable

from grpo_jax.rewards.registry import get_reward, register_reward

_STRICT_RE = re.compile(r"\s*<think>(?P<think>.*?)</think>\s*<answer>(?P<answer>.*?)</answer>\s*", re.DOTALL)
_LENIENT_RE = re.compile(r"<think>.*?</think>.*?<answer>(?P<answer>.*?)</answer>", re.DOTALL)
_TAGS = ("<think>", "</think>", "<answer>", "</answer>")


def strict_format_ok(completion: str) -> bool:
  m = _STRICT_RE.fullmatch(completion)
  return (m is not None and bool(m.group("answer").strip())
          and all(completion.count(tag) == 1 for tag in _TAGS))


def lenient_format_ok(completion: str) -> bool:
  return any(m.group("answer").strip() for m in _LENIENT_RE.finditer(completion))


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


def gate_on_format(accuracy_fn: Callable | str, format_fn: Callable | str = "format_strict",
                   otherwise: float = 0.0):
  """A new reward fn: the accuracy score where the format score is 1.0, `otherwise` elsewhere.

  `None` (not applicable) from the accuracy fn passes through unchanged.
  """
  accuracy_fn, format_fn = get_reward(accuracy_fn), get_reward(format_fn)

  def gated(prompts: list[str], completions: list[str], **columns) -> list[float | None]:
    formats = format_fn(prompts, completions, **columns)
    scores = accuracy_fn(prompts, completions, **columns)
    if len(formats) != len(completions) or len(scores) != len(completions):
      raise ValueError(f"gated reward: got {len(scores)} accuracy and {len(formats)} format scores for "
                       f"{len(completions)} completions")
    return [s if (f == 1.0 or s is None) else otherwise for s, f in zip(scores, formats)]

  gated.__name__ = f"{getattr(accuracy_fn, '__name__', 'reward')}_gated"
  return gated

"""Rewards for the `<reasoning>…</reasoning><answer>…</answer>` layout of Google Tunix's GRPO demo (Gemma 3
1B-it on GSM8K, `examples/grpo_gemma.ipynb`; experiments/gemma3_gsm8k.py), written here from the demo's rules.
The demo sums four rewards; the recipe gives back the demo's points as weights where a score here is 0/1:

  reasoning_format         1.0 when the completion has the format, else 0.0 (demo: 3 points; weight 3.0).
                           The format, as the demo's multi-line regular expression reads it: "<reasoning>" at the
                           start of a line (whitespace before it allowed), at least one character, "</reasoning>",
                           anything, "<answer>", at least one character, "</answer>", then only whitespace up to
                           the end of a line. Lines before and after are allowed.
  reasoning_format_tags    +0.5 or -0.5 for each of: one "<reasoning>", the completion starts with it, one
                           "</reasoning>", one "<answer>", one "</answer>"; -2.5 .. 2.5 (the demo's points).
  reasoning_answer_graded  the demo's answer check, on the answer that `reasoning_format` finds: 0 without one;
                           3 if it equals the gold text, 1.5 if equal once whitespace is stripped; else as
                           numbers, guess / gold in [0.9, 1.1]: 0.5, in [0.8, 1.2]: 0.25, otherwise -1; -0.5 when
                           either is not a number (or the gold is 0).
  reasoning_answer_number  1.0 when the first run of digits and dots after the first "<answer>" (closed or not)
                           equals the gold as a float, else 0.0 (demo: 1.5 points; weight 1.5). The demo's
                           accuracy uses the same rule, so the recipe evaluates with it.

Gold: the dataset's `answer` column (GSM8K rows: the number after "####"; a full "... #### 42" also works).
Scans are linear in the completion (no backtracking regular expression; tests/rewards check them against one).
"""
from __future__ import annotations

from grpo_jax.rewards.registry import register_answer_key, register_reward

_R_OPEN, _R_CLOSE, _A_OPEN, _A_CLOSE = "<reasoning>", "</reasoning>", "<answer>", "</answer>"


def _gold(answer) -> str:
  text = str(answer)
  return (text.split("####")[1] if "####" in text else text).strip()


def _line_start_before(s: str, i: int) -> bool:
  """Only whitespace between a line start and s[i]."""
  while i > 0 and s[i - 1].isspace():
    if s[i - 1] == "\n":
      return True
    i -= 1
  return i == 0


def _line_end_after(s: str, i: int) -> bool:
  """Only whitespace between s[i] and a line end."""
  while i < len(s) and s[i].isspace():
    if s[i] == "\n":
      return True
    i += 1
  return i == len(s)


def formatted_answer(completion: str) -> str | None:
  """The `<answer>` text of the first match of the format (module docstring), None when it has none.

  The earliest choice of each tag is the one the demo's lazy regular expression takes: a later tag never leaves
  more room for the ones after it."""
  s = completion
  start = s.find(_R_OPEN)
  while start >= 0 and not _line_start_before(s, start):
    start = s.find(_R_OPEN, start + 1)
  if start < 0:
    return None
  close = s.find(_R_CLOSE, start + len(_R_OPEN) + 1)        # at least one character of reasoning
  answer = s.find(_A_OPEN, close + len(_R_CLOSE)) if close >= 0 else -1
  if answer < 0:
    return None
  end = s.find(_A_CLOSE, answer + len(_A_OPEN) + 1)         # at least one character of answer
  while end >= 0 and not _line_end_after(s, end + len(_A_CLOSE)):
    end = s.find(_A_CLOSE, end + 1)
  return s[answer + len(_A_OPEN):end] if end >= 0 else None


@register_reward("reasoning_format")
def reasoning_format(prompts: list[str], completions: list[str], **unused_columns) -> list[float]:
  del prompts, unused_columns
  return [float(formatted_answer(c) is not None) for c in completions]


@register_reward("reasoning_format_tags")
def reasoning_format_tags(prompts: list[str], completions: list[str], **unused_columns) -> list[float]:
  del prompts, unused_columns
  checks = lambda c: (c.count(_R_OPEN) == 1, c.startswith(_R_OPEN), c.count(_R_CLOSE) == 1,
                      c.count(_A_OPEN) == 1, c.count(_A_CLOSE) == 1)
  return [sum(0.5 if ok else -0.5 for ok in checks(c)) for c in completions]


def _graded(guess: str | None, gold: str) -> float:
  if guess is None:
    return 0.0
  if guess == gold:
    return 3.0
  if guess.strip() == gold.strip():
    return 1.5
  try:
    ratio = float(guess) / float(gold)
  except (ValueError, ZeroDivisionError, OverflowError):
    return -0.5
  return 0.5 if 0.9 <= ratio <= 1.1 else 0.25 if 0.8 <= ratio <= 1.2 else -1.0


@register_reward("reasoning_answer_graded")
def reasoning_answer_graded(prompts: list[str], completions: list[str], answer: list, **unused_columns) -> list[float]:
  del prompts, unused_columns
  return [_graded(formatted_answer(c), _gold(a)) for c, a in zip(completions, answer, strict=True)]


def first_number_after_answer(completion: str) -> str | None:
  """The first run of digits and dots after the first "<answer>", None without one."""
  i = completion.find(_A_OPEN)
  if i < 0:
    return None
  i += len(_A_OPEN)
  is_part = lambda ch: ch.isdecimal() or ch == "."
  while i < len(completion) and not is_part(completion[i]):
    i += 1
  j = i
  while j < len(completion) and is_part(completion[j]):
    j += 1
  return completion[i:j] or None


def _number_equal(guess: str | None, gold: str) -> float:
  if guess is None:
    return 0.0
  try:
    return float(float(guess) == float(gold))
  except (ValueError, OverflowError):
    return 0.0


@register_reward("reasoning_answer_number")
def reasoning_answer_number(prompts: list[str], completions: list[str], answer: list, **unused_columns) -> list[float]:
  del prompts, unused_columns
  return [_number_equal(first_number_after_answer(c), _gold(a)) for c, a in zip(completions, answer, strict=True)]


register_answer_key("reasoning_answer_number")(first_number_after_answer)
register_answer_key("reasoning_answer_graded")(formatted_answer)

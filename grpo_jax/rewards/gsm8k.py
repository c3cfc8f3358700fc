"""GSM8K-style numeric answers.

Gold: the text after the last `####` of the dataset's answer field (the whole field when it has no `####`),
read as a number.

Prediction, by the first rule whose marker is present in the completion (a later rule is never consulted
once a marker is found, so a model cannot hedge with an empty `<answer>` tag and a number elsewhere):
  1. the last complete `<answer>...</answer>`: the number it consists of, else its last number;
  2. the last line starting with `####`: the first number after the marker;
  3. the last `\\boxed{...}`: the number it consists of, else its last number;
  4. otherwise the last number anywhere in the completion.
Numbers may carry `$`, thousands commas, a unicode minus, decimals (`18.0` == `18`), `%` or a unit word, and
are compared exactly as rationals.
"""
from __future__ import annotations

import re
from fractions import Fraction

from grpo_jax.rewards.answers import answer_tag_content, find_numbers, last_boxed, last_number, parse_number
from grpo_jax.rewards.registry import register_answer_key, register_reward

_HASH_LINE_RE = re.compile(r"^[ \t]*####(.*)$", re.MULTILINE)


def gsm8k_gold(answer: str | int | float) -> Fraction | None:
  """The number after the last `####` of a GSM8K answer (or the whole answer when it has no `####`)."""
  if isinstance(answer, bool):
    raise TypeError(f"gold answer {answer!r} is a bool, not a number or string")
  if isinstance(answer, int):
    return Fraction(answer)
  if isinstance(answer, float):
    return Fraction(str(answer))
  text = str(answer)
  if "####" in text:
    text = text.rsplit("####", 1)[1]
  return _number_in(text)


def _number_in(text: str) -> Fraction | None:
  value = parse_number(text)
  return value if value is not None else last_number(text)


def extract_gsm8k_prediction(completion: str) -> Fraction | None:
  """The model's numeric answer by the documented order of rules (module docstring); None if none."""
  tagged = answer_tag_content(completion)
  if tagged is not None:
    boxed = last_boxed(tagged)
    return _number_in(boxed if boxed is not None else tagged)
  hash_lines = _HASH_LINE_RE.findall(completion)
  if hash_lines:
    numbers = find_numbers(hash_lines[-1])
    return numbers[0] if numbers else None
  boxed = last_boxed(completion)
  if boxed is not None:
    return _number_in(boxed)
  return last_number(completion)


def gsm8k_equal(completion: str, gold_answer: str | int | float) -> bool:
  gold = gsm8k_gold(gold_answer)
  if gold is None:
    raise ValueError(f"gold answer {gold_answer!r} contains no number")
  prediction = extract_gsm8k_prediction(completion)
  return prediction is not None and prediction == gold


@register_reward("gsm8k_accuracy")
def gsm8k_accuracy(prompts: list[str], completions: list[str], answer: list, **unused_columns) -> list[float]:
  """1.0 when the completion's numeric answer equals the gold one (column `answer`), else 0.0."""
  del prompts, unused_columns
  return [float(gsm8k_equal(c, a)) for c, a in zip(completions, answer, strict=True)]


register_answer_key("gsm8k_accuracy")(extract_gsm8k_prediction)  # a Fraction: "12" and "12.0" vote together

"""A calculator tool: the policy may ask for the value of an arithmetic expression before it answers.

Protocol (character level, the `tool_arithmetic` task's vocabulary): a message ending in "?" is a tool call,
"37*8?" -> observation "[296]"; any other message is the final answer, which ends the episode (the task's reward
functions grade it). A malformed call gets "[?]". The environment gives no reward of its own.
"""
from __future__ import annotations

import re

from grpo_jax.envs.base import Environment, StepResult, register_env

CALL_END = "?"
_EXPRESSION = re.compile(r"^\d{1,6}([+\-*]\d{1,6}){0,3}$")


def evaluate_expression(text: str) -> int | None:
  """The value of digits joined by + - * (usual precedence, at most 4 operands), or None if malformed. Parsed by
  hand: nothing of the model's text is ever passed to `eval`."""
  if not _EXPRESSION.match(text):
    return None
  total, term, sign = 0, None, 1
  for token in re.findall(r"\d+|[+\-*]", text):
    if token == "*":
      continue
    if token in "+-":
      total += sign * term
      term, sign = None, (1 if token == "+" else -1)
      continue
    term = int(token) if term is None else term * int(token)
  return total + sign * term


@register_env("calculator")
class Calculator(Environment):
  stop_strings = (CALL_END,)

  def __init__(self, max_calls: int = 4):
    self.max_calls = max_calls
    self.calls = 0

  def reset(self, prompt: str) -> None:
    self.calls = 0

  def step(self, message: str) -> StepResult:
    if not message.endswith(CALL_END):
      return StepResult("", 0.0, True)  # the answer
    self.calls += 1
    value = evaluate_expression(message[:-1])
    return StepResult("[?]" if value is None else f"[{value}]", 0.0, self.calls >= self.max_calls)

"""Countdown: reach `target` with an arithmetic expression over the given `numbers`.

The expression is the content of the last `<answer>...</answer>` (a trailing "= value" is ignored). It is
parsed by a small recursive-descent parser that accepts only integer literals, + - * /, unary minus and
parentheses (`×`, `÷` and the unicode minus are read as *, /, -); anything else makes the answer invalid.
Model text is never evaluated by Python. Each literal must be one of the given numbers, each number used at
most once (unused numbers are allowed unless `require_all=True`). Arithmetic is exact (`Fraction`), so
8/3*3 == 8; a division by zero makes the answer invalid. Score: 1.0 if the value equals the target, else
`format_score` when the expression was valid, else 0.0.

Columns: `numbers` (a sequence of ints per row) and `target` (an int per row).
"""
from __future__ import annotations

import collections
import re
from fractions import Fraction

from grpo_jax.rewards.answers import answer_tag_content
from grpo_jax.rewards.registry import register_reward

MAX_EXPRESSION_CHARS = 512
MAX_DEPTH = 64

_TOKEN_RE = re.compile(r"\s*(?:(?P<int>\d+)|(?P<op>[-+*/()]))")
_TRANSLATE = str.maketrans({"×": "*", "÷": "/", "\u2212": "-", "\u2013": "-"})


class InvalidExpression(ValueError):
  pass


def _tokenize(text: str) -> list[str | int]:
  tokens, pos = [], 0
  text = text.rstrip()
  while pos < len(text):
    m = _TOKEN_RE.match(text, pos)
    if m is None:
      raise InvalidExpression(f"unexpected character {text[pos:].lstrip()[:1]!r}")
    tokens.append(int(m.group("int")) if m.group("int") is not None else m.group("op"))
    pos = m.end()
  return tokens


class _Parser:
  """expr := term (('+'|'-') term)*; term := unary (('*'|'/') unary)*; unary := '-' unary | atom;
  atom := INT | '(' expr ')'."""

  def __init__(self, tokens):
    self.tokens, self.pos, self.literals = tokens, 0, []

  def peek(self):
    return self.tokens[self.pos] if self.pos < len(self.tokens) else None

  def take(self):
    token = self.peek()
    self.pos += 1
    return token

  def expr(self, depth):
    if depth > MAX_DEPTH:
      raise InvalidExpression("expression nested too deeply")
    value = self.term(depth)
    while self.peek() in ("+", "-"):
      op, rhs = self.take(), self.term(depth)
      value = value + rhs if op == "+" else value - rhs
    return value

  def term(self, depth):
    value = self.unary(depth)
    while self.peek() in ("*", "/"):
      op, rhs = self.take(), self.unary(depth)
      if op == "*":
        value *= rhs
      elif rhs == 0:
        raise InvalidExpression("division by zero")
      else:
        value /= rhs
    return value

  def unary(self, depth):
    if self.peek() == "-":
      self.take()
      if depth > MAX_DEPTH:
        raise InvalidExpression("expression nested too deeply")
      return -self.unary(depth + 1)
    return self.atom(depth)

  def atom(self, depth):
    token = self.take()
    if isinstance(token, int):
      self.literals.append(token)
      return Fraction(token)
    if token == "(":
      value = self.expr(depth + 1)
      if self.take() != ")":
        raise InvalidExpression("unbalanced parentheses")
      return value
    raise InvalidExpression(f"expected a number or '(', got {token!r}")


def evaluate_expression(text: str) -> tuple[Fraction, list[int]]:
  """(exact value, integer literals in order) of an arithmetic expression; InvalidExpression otherwise."""
  if len(text) > MAX_EXPRESSION_CHARS:
    raise InvalidExpression(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
  tokens = _tokenize(text.translate(_TRANSLATE))
  if not tokens:
    raise InvalidExpression("empty expression")
  parser = _Parser(tokens)
  value = parser.expr(0)
  if parser.pos != len(tokens):
    raise InvalidExpression(f"unexpected {tokens[parser.pos]!r} after a complete expression")
  return value, parser.literals


def countdown_score(completion: str, numbers, target, require_all: bool = False,
                    format_score: float = 0.0) -> float:
  if isinstance(numbers, (str, bytes)) or not all(isinstance(x, int) or float(x).is_integer() for x in numbers):
    raise TypeError(f"numbers must be a sequence of integers, got {numbers!r}")
  expression = answer_tag_content(completion)
  if expression is None:
    return 0.0
  expression = re.sub(r"=\s*[-\u2212]?\d+(?:\.\d+)?\s*$", "", expression.strip())
  try:
    value, literals = evaluate_expression(expression)
  except InvalidExpression:
    return 0.0
  available = collections.Counter(int(x) for x in numbers)
  used = collections.Counter(literals)
  if used - available or (require_all and used != available):
    return 0.0
  return 1.0 if value == Fraction(int(target)) else format_score


def make_countdown_reward(require_all: bool = False, format_score: float = 0.0):
  """A reward fn over columns `numbers` and `target` (see the module docstring)."""

  def countdown(prompts: list[str], completions: list[str], numbers: list, target: list,
                **unused_columns) -> list[float]:
    del prompts, unused_columns
    return [countdown_score(c, n, t, require_all, format_score)
            for c, n, t in zip(completions, numbers, target, strict=True)]

  return countdown


countdown = register_reward("countdown")(make_countdown_reward())
countdown_all_numbers = register_reward("countdown_all_numbers")(make_countdown_reward(require_all=True))

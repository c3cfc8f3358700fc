"""MATH-style answers: the last `\\boxed{...}`, string normalization, and optional symbolic checking.

Prediction: the content of the last complete `<answer>...</answer>` if there is one (its last `\\boxed{}` if
it holds one, else all of it); otherwise the last `\\boxed{...}` / `\\fbox{...}` of the completion (braces
matched); otherwise no answer (score 0). Gold: the last `\\boxed{}` of the answer field when it has one,
else the whole field.

Built-in equivalence: the normalized strings are equal, or both are numbers (integers, decimals, `a/b`,
`\\frac{a}{b}`) with equal exact rational values. Normalization (after Hendrycks et al.'s MATH checker):
drops `\\left`/`\\right`, spacing commands and spaces, `^\\circ`, `%`, `$`, trailing units in `\\text{}`,
a trailing ".", a leading "x =" ; unwraps `\\text{}`/`\\mathrm{}`/`\\mathbf{}`; `\\dfrac`/`\\tfrac`/`\\cfrac` ->
`\\frac`; `\\frac12` -> `\\frac{1}{2}`; `\\sqrt2` -> `\\sqrt{2}`; `a/b` -> `\\frac{a}{b}`; "0.5" == ".5". From
Minerva's normalizer (Lewkowycz et al. 2022): unit words after a value ("5 inches", "12 dollars"),
`\\text{and}` -> ","; redundant braces (`x^{2}` -> `x^2`, `{5}` -> `5`); trailing decimal zeros ("2.50" -> "2.5",
"3.0" -> "3", also inside tuples and expressions).

The `math_verify` backend (Hugging Face's `math-verify`, `pip install 'grpo_jax[math]'`) additionally asks
`verify(parse(gold), parse(prediction))` (gold first) when the built-in check says "not equal", which accepts
symbolically equal answers such as `2\\sqrt{2}` and `\\sqrt{8}`. Its own timeouts use `signal.alarm`, which only
works on the main thread, so they are switched off on other threads (the scorer's worker threads), where
`score_completions`' timeout protects the run instead.
"""
from __future__ import annotations

import logging
import re
import threading
from fractions import Fraction

from grpo_jax.rewards.answers import answer_tag_content, last_boxed
from grpo_jax.rewards.registry import register_answer_key, register_reward

logger = logging.getLogger(__name__)

MATH_VERIFY_TIMEOUT_S = 5  # math-verify's own timeout per parse/verify, used on the main thread only

_UNIT_TEXT_RE = re.compile(r"^(.+?)\s*\\(?:text|mbox|textrm|mathrm)\{\s*[A-Za-z][A-Za-z\s.^{}]*\}$")
# Minerva's list of unit and noun words dropped after a value (separated by a space or inside \\text{}).
_UNIT_WORDS = ("units", "unit", "square units", "inches", "inch", "feet", "foot", "ft", "cm", "km", "meters",
               "mph", "hours", "hour", "minutes", "seconds", "degrees", "dollars", "cents", "pounds", "points",
               "ways", "digits", "integers", "students", "edges", "sq units")
_UNIT_WORD_RE = re.compile(r"^(.*?[\d}])\s+(?:%s)\.?$" % "|".join(re.escape(w) for w in
                                                                   sorted(_UNIT_WORDS, key=len, reverse=True)))
_WRAPPERS_RE = re.compile(r"\\(?:text|textbf|textrm|mbox|mathrm|mathbf|operatorname)\{([^{}]*)\}")


def extract_math_prediction(completion: str) -> str | None:
  """The answer string of a completion by the documented rules (module docstring), or None."""
  tagged = answer_tag_content(completion)
  if tagged is not None:
    boxed = last_boxed(tagged)
    return boxed if boxed is not None else tagged
  return last_boxed(completion)


def math_gold(answer: str) -> str:
  """The gold answer string: the last boxed of a solution, or the field itself."""
  text = str(answer)
  boxed = last_boxed(text)
  return boxed if boxed is not None else text


def normalize_math_answer(answer: str) -> str:
  """A canonical string for comparing final answers (rules in the module docstring)."""
  s = answer.strip()
  s = s.replace("\n", " ").replace("\\!", "").replace("\\displaystyle", "")
  s = re.sub(r"\\[,;: ]", " ", s).replace("~", " ")
  s = s.replace("\\left", "").replace("\\right", "")
  s = re.sub(r"\^\s*\{?\\circ\}?", "", s).replace("°", "").replace("\\degree", "")
  s = s.replace("\\%", "").replace("%", "").replace("\\$", "").replace("$", "")
  s = s.strip().rstrip(".").strip()
  s = re.sub(r",?\s*\\text\{\s*and\s*\}\s*", ",", s)      # "1, \text{ and } 2" -> "1,2"
  m = _UNIT_WORD_RE.match(s)  # "5 inches" -> "5"
  if m:
    s = m.group(1)
  m = _UNIT_TEXT_RE.match(s)  # "5\text{ cm}" -> "5": a unit after a value
  if m and re.search(r"[\d}]", m.group(1)):
    s = m.group(1)
  while _WRAPPERS_RE.search(s):
    s = _WRAPPERS_RE.sub(r"\1", s)
  s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac").replace("\\cfrac", "\\frac")
  s = s.replace("\u2212", "-")
  s = s.replace(" ", "")
  s = re.sub(r"\\frac(\d)(\d)", r"\\frac{\1}{\2}", s)
  s = re.sub(r"\\frac\{([^{}]*)\}(\d)", r"\\frac{\1}{\2}", s)
  s = re.sub(r"\\frac(\d)\{", r"\\frac{\1}{", s)
  s = re.sub(r"\\sqrt(\d+|[a-zA-Z])", r"\\sqrt{\1}", s)
  s = s.replace("{,}", ",")
  s = re.sub(r"([\^_])\{([A-Za-z0-9])\}", r"\1\2", s)   # x^{2} -> x^2, a_{1} -> a_1
  s = _strip_outer_braces(s)
  s = re.sub(r"(\d\.\d*?[1-9])0+(?!\d)", r"\1", s)       # 2.50 -> 2.5
  s = re.sub(r"(\d)\.0+(?!\d)", r"\1", s)                 # 3.0 -> 3
  if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", s):
    s = s.replace(",", "")
  m = re.fullmatch(r"[a-zA-Z]=(.+)", s)  # "x=5" -> "5" (a single variable on the left)
  if m and "=" not in m.group(1):
    s = m.group(1)
  m = re.fullmatch(r"(-?)(\d+)/(\d+)", s)
  if m:
    s = f"{m.group(1)}\\frac{{{m.group(2)}}}{{{m.group(3)}}}"
  if s.startswith("."):
    s = "0" + s
  s = s.replace("-.", "-0.")
  return s.rstrip(".")


def _strip_outer_braces(s: str) -> str:
  """"{5}" -> "5", "{{x}}" -> "x"; "{1}{2}" is kept (its first brace closes before the end)."""
  while len(s) >= 2 and s[0] == "{" and s[-1] == "}":
    depth = 0
    for i, ch in enumerate(s):
      depth += (ch == "{") - (ch == "}")
      if depth == 0 and i < len(s) - 1:
        return s
    s = s[1:-1]
  return s


def math_number(normalized: str) -> Fraction | None:
  """The exact value of a normalized answer that is a plain number or a fraction of integers."""
  if re.fullmatch(r"-?\d+(\.\d+)?", normalized):
    return Fraction(normalized)
  m = re.fullmatch(r"(-?)\\frac\{(-?\d+(?:\.\d+)?)\}\{(-?\d+(?:\.\d+)?)\}", normalized)
  if m and Fraction(m.group(3)) != 0:
    value = Fraction(m.group(2)) / Fraction(m.group(3))
    return -value if m.group(1) else value
  return None


def math_answers_equal(prediction: str, gold: str) -> bool:
  """Built-in equivalence of two answer strings (not the completions): normalized text or exact value."""
  a, b = normalize_math_answer(prediction), normalize_math_answer(gold)
  if not a:
    return False
  if a == b:
    return True
  va, vb = math_number(a), math_number(b)
  return va is not None and va == vb


def _math_verify_module():
  """math_verify, or None (with one logged message) when the package is not installed."""
  try:
    import math_verify  # pylint: disable=import-outside-toplevel  (an optional dependency)
  except ImportError:
    if not getattr(_math_verify_module, "warned", False):
      logger.warning("the math_verify backend needs Hugging Face's math-verify package "
                     "(pip install 'grpo_jax[math]'); falling back to the built-in normalizer")
      _math_verify_module.warned = True
    return None
  return math_verify


def math_verify_equal(prediction: str, gold: str) -> bool | None:
  """math-verify's verdict on two answer strings; None when the package is missing."""
  mv = _math_verify_module()
  if mv is None:
    return None
  timeout = MATH_VERIFY_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None
  gold_parsed = mv.parse(f"\\boxed{{{gold}}}", parsing_timeout=timeout)
  pred_parsed = mv.parse(f"\\boxed{{{prediction}}}", parsing_timeout=timeout)
  if not gold_parsed or not pred_parsed:
    return False
  return bool(mv.verify(gold_parsed, pred_parsed, timeout_seconds=timeout))


def math_equal(completion: str, gold_answer: str, backend: str = "builtin") -> bool:
  """Whether the completion's final answer equals the gold answer; backend "builtin" or "math_verify"."""
  if backend not in ("builtin", "math_verify"):
    raise ValueError(f"unknown math backend {backend!r}; expected 'builtin' or 'math_verify'")
  prediction = extract_math_prediction(completion)
  if prediction is None or not prediction.strip():
    return False
  gold = math_gold(gold_answer)
  if math_answers_equal(prediction, gold):
    return True
  if backend == "math_verify":
    return bool(math_verify_equal(prediction, gold))
  return False


def make_math_accuracy(backend: str = "builtin"):
  """A reward fn scoring 1.0 for answers equal to the `answer` column under `backend`, else 0.0."""
  if backend not in ("builtin", "math_verify"):
    raise ValueError(f"unknown math backend {backend!r}; expected 'builtin' or 'math_verify'")

  def math_accuracy(prompts: list[str], completions: list[str], answer: list, **unused_columns) -> list[float]:
    del prompts, unused_columns
    return [float(math_equal(c, a, backend)) for c, a in zip(completions, answer, strict=True)]

  math_accuracy.__name__ = "math_accuracy" if backend == "builtin" else "math_verify_accuracy"
  return math_accuracy


math_accuracy = register_reward("math_accuracy")(make_math_accuracy("builtin"))
math_verify_accuracy = register_reward("math_verify_accuracy")(make_math_accuracy("math_verify"))


@register_answer_key("math_accuracy")
@register_answer_key("math_verify_accuracy")
def math_answer_key(completion: str) -> str | None:
  """The normalized final answer (so "\\frac12" and "\\frac{1}{2}" vote together)."""
  prediction = extract_math_prediction(completion)
  return None if prediction is None else normalize_math_answer(prediction)

"""Pulling final answers out of model text: numbers, `<answer>` tags, `\\boxed{...}`.

Pure string functions shared by the GSM8K and MATH verifiers. Numbers are returned as exact `Fraction`s so
that "12", "12.0", "12.00" and "24/2" compare equal without floating-point tolerance.
"""
from __future__ import annotations

import re
from fractions import Fraction

# Minus signs that models and LaTeX produce: ASCII hyphen-minus, U+2212 MINUS SIGN, U+FE63, U+FF0D.
_MINUS = "-\u2212\ufe63\uff0d"

# A number token: optional sign (only when not glued to a preceding word/digit, so "3-5" yields 3 and 5),
# optional currency, digits with optional thousands separators, optional decimals, optional "/denominator".
NUMBER_RE = re.compile(
    rf"(?<![\w.)])(?P<sign>[{_MINUS}])?\$?"
    r"(?P<int>\d{1,3}(?:,\d{3})+(?!\d)|\d+)?(?P<frac>\.\d+)?"
    r"(?:/(?P<den>\d+)(?![\d.]))?")

_BOX_COMMANDS = ("\\boxed", "\\fbox")


# Longer digit strings are not answers (and Python refuses to convert more than 4300 digits to an int).
MAX_DIGITS = 1000


def _fraction_from_match(m: re.Match) -> Fraction | None:
  if m.group("int") is None and m.group("frac") is None:
    return None
  if len(m.group("int") or "") + len(m.group("frac") or "") + len(m.group("den") or "") > MAX_DIGITS:
    return None
  value = Fraction((m.group("int") or "0").replace(",", "") + (m.group("frac") or ""))
  if m.group("den") is not None:
    den = int(m.group("den"))
    if den == 0:
      return None
    value /= den
  return -value if m.group("sign") else value


def find_numbers(text: str) -> list[Fraction]:
  """Every number in `text`, in order, as exact fractions ("$1,234.50" -> 2469/2, "−3" -> -3)."""
  numbers = []
  for m in NUMBER_RE.finditer(text):
    value = _fraction_from_match(m)
    if value is not None:
      numbers.append(value)
  return numbers


def last_number(text: str) -> Fraction | None:
  numbers = find_numbers(text)
  return numbers[-1] if numbers else None


def parse_number(text: str) -> Fraction | None:
  """The number that `text` consists of, allowing "$", "%", "\\$", "\\%", thousands commas, a trailing ".",
  unit words after the number ("18 dollars", "5\\text{ cm}") and LaTeX `\\frac{a}{b}`; None otherwise."""
  s = text.strip()
  s = re.sub(r"\\(?:text|mbox|mathrm)\{\s*[A-Za-z][A-Za-z .]*\}\s*$", "", s)  # trailing unit in LaTeX
  s = s.replace("\\$", "$").replace("\\%", "%").replace("\\!", "").replace("{,}", ",").strip()
  s = re.sub(r"^\\?[dt]?frac\{(\d+)\}\{(\d+)\}$", r"\1/\2", s.replace("\\dfrac", "\\frac"))
  s = re.sub(rf"^([{_MINUS}])\s*\\frac\{{(\d+)\}}\{{(\d+)\}}$", r"\1\2/\3", s)
  m = NUMBER_RE.match(s)
  if m is None or m.end() == 0:
    return None
  rest = s[m.end():].strip().rstrip(".").strip()
  # Allowed leftovers: a percent sign or a word-like unit ("dollars", "cm", "km/h"), nothing numeric.
  if rest and not re.fullmatch(r"%|[A-Za-z][A-Za-z/ .]*", rest):
    return None
  return _fraction_from_match(m)


def answer_tag_content(text: str) -> str | None:
  """The content of the LAST complete `<answer>...</answer>` pair, or None when there is none."""
  # The pairs a regex `<answer>(.*?)</answer>` would find, scanned with str.find: linear in the length
  # (the regex rescans to the end from every unclosed "<answer>", quadratic on adversarial completions).
  last, pos = None, 0
  while (start := text.find("<answer>", pos)) >= 0:
    end = text.find("</answer>", start + len("<answer>"))
    if end < 0:
      break
    last, pos = text[start + len("<answer>"):end], end + len("</answer>")
  return last


def last_boxed(text: str) -> str | None:
  """The content of the last `\\boxed{...}` or `\\fbox{...}` (braces matched, so nested braces are kept);
  `\\boxed 5` (no braces) gives "5". None when absent or when its braces never close."""
  start = max(text.rfind(cmd) for cmd in _BOX_COMMANDS)
  if start < 0:
    return None
  i = start + len("\\boxed" if text.startswith("\\boxed", start) else "\\fbox")
  if i < len(text) and text[i] == " ":
    m = re.match(r" +([^\s$]+)", text[i:])
    return m.group(1) if m else None
  while i < len(text) and text[i].isspace():
    i += 1
  if i >= len(text) or text[i] != "{":
    return None
  depth = 0
  for j in range(i, len(text)):
    if text[j] == "{" and (j == 0 or text[j - 1] != "\\"):
      depth += 1
    elif text[j] == "}" and text[j - 1] != "\\":
      depth -= 1
      if depth == 0:
        return text[i + 1:j]
  return None

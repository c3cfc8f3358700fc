from fractions import Fraction

import pytest

from grpo_jax.rewards import answers, gsm8k, math_answer
from grpo_jax.rewards import gsm8k_accuracy, math_accuracy
from .answer_cases import GSM8K_CASES, GSM8K_GOLD, MATH_CASES


def test_fixture_is_large_enough():
  assert len(GSM8K_CASES) + len(MATH_CASES) >= 60
  # Both outcomes are well represented, so a checker that always says yes (or no) fails many cases.
  for cases in (GSM8K_CASES, MATH_CASES):
    assert 0.25 < sum(expected for *_, expected in cases) / len(cases) < 0.85


@pytest.mark.parametrize("completion,gold,expected", GSM8K_CASES)
def test_gsm8k_cases(completion, gold, expected):
  gold = GSM8K_GOLD.get(gold, gold) if isinstance(gold, str) else gold
  assert gsm8k.gsm8k_equal(completion, gold) is expected


@pytest.mark.parametrize("completion,gold,expected", MATH_CASES)
def test_math_cases(completion, gold, expected):
  assert math_answer.math_equal(completion, gold) is expected


def test_reward_fns_score_batches_in_order():
  golds = [GSM8K_GOLD.get(g, g) if isinstance(g, str) else g for _, g, _ in GSM8K_CASES]
  completions = [c for c, _, _ in GSM8K_CASES]
  expected = [float(e) for *_, e in GSM8K_CASES]
  assert gsm8k_accuracy([""] * len(golds), completions, answer=golds, other_column=golds) == expected
  completions = [c for c, _, _ in MATH_CASES]
  assert math_accuracy([""] * len(completions), completions, answer=[g for _, g, _ in MATH_CASES]) == [
      float(e) for *_, e in MATH_CASES]


@pytest.mark.parametrize("text,numbers", [
    ("$1,234.50 and −3 apples", [Fraction(246900, 200), -3]),
    ("3-5 = -2", [3, 5, -2]),
    ("x2 + 10x, 0.75 or .5", [10, Fraction(3, 4), Fraction(1, 2)]),
    ("1/2 cup and 12,34", [Fraction(1, 2), 12, 34]),
    ("version 1,000,000!", [1000000]),
])
def test_find_numbers(text, numbers):
  assert answers.find_numbers(text) == numbers


@pytest.mark.parametrize("text,value", [
    ("18", 18), (" $18.00 ", 18), ("18 dollars.", 18), ("50%", 50), ("\\$4.50", Fraction(9, 2)),
    ("\\frac{3}{4}", Fraction(3, 4)), ("-\\dfrac{1}{2}", Fraction(-1, 2)), ("5\\text{ cm}", 5),
    ("1{,}000", 1000), ("\u22127", -7), ("7 and 8", None), ("seven", None), ("", None),
])
def test_parse_number(text, value):
  assert answers.parse_number(text) == value


@pytest.mark.parametrize("text,content", [
    ("\\boxed{a} then \\boxed{b}", "b"),
    ("\\boxed{\\frac{a}{\\sqrt{b}}} tail }", "\\frac{a}{\\sqrt{b}}"),
    ("\\fbox{x} and \\boxed{y}", "y"),
    ("\\boxed{y} and \\fbox{x}", "x"),
    ("\\boxed{\\{1\\}}", "\\{1\\}"),   # escaped braces do not count
    ("\\boxed 5 is it", "5"),
    ("\\boxed{unclosed", None),
    ("no box", None),
])
def test_last_boxed(text, content):
  assert answers.last_boxed(text) == content


def test_gsm8k_gold_extraction():
  assert gsm8k.gsm8k_gold(GSM8K_GOLD["money"]) == 1200
  assert gsm8k.gsm8k_gold("a #### 3 #### 4") == 4
  assert gsm8k.gsm8k_gold(2.5) == Fraction(5, 2)
  with pytest.raises(ValueError, match="no number"):
    gsm8k.gsm8k_equal("<answer>1</answer>", "#### none")


def test_math_normalization_examples():
  norm = math_answer.normalize_math_answer
  assert norm("\\left( \\dfrac12, 3 \\right).") == "(\\frac{1}{2},3)"
  assert norm("y = 2x + 1") == "2x+1"
  assert norm("\\text{Monday}") == "Monday"
  assert norm("\\$ 1,000") == "1000"


# One pair per normalization rule that only that rule makes equal, and a near miss it must keep apart.
MATH_RULES = [
    ("\\left/\\right", "\\left(1,2\\right)", "(1,2)", "(1,3)"),
    ("\\dfrac", "\\dfrac{1}{3}", "\\frac{1}{3}", "\\frac{1}{4}"),
    ("\\tfrac", "\\tfrac{1}{3}", "\\frac{1}{3}", "\\frac{2}{3}"),
    ("\\cfrac", "\\cfrac{x}{3}", "\\frac{x}{3}", "\\frac{y}{3}"),
    ("frac shorthand", "\\frac{x}2", "\\frac{x}{2}", "\\frac{x}{3}"),
    ("sqrt shorthand", "3\\sqrt5", "3\\sqrt{5}", "3\\sqrt{6}"),
    ("spacing commands", "a\\,b\\;c\\!d", "abcd", "abce"),
    ("degrees", "30^{\\circ}", "30", "31"),
    ("percent", "40\\%", "40", "41"),
    ("dollars", "\\$7", "7", "8"),
    ("unit in \\text", "6\\text{ cm}", "6", "7"),
    ("unit word", "6 inches", "6", "9"),
    ("unit word (dollars)", "12 dollars", "12", "21"),
    ("\\text{and}", "1, \\text{ and } 2", "1,2", "1,3"),
    ("\\text wrapper", "\\text{east}", "east", "west"),
    ("\\mathbf wrapper", "\\mathbf{v}", "v", "w"),
    ("braces in a superscript", "x^{2}+1", "x^2+1", "x^3+1"),
    ("braces in a subscript", "a_{1}", "a_1", "a_2"),
    ("outer braces", "{5}", "5", "6"),
    ("trailing zeros", "2.50", "2.5", "2.05"),
    ("trailing zeros in a tuple", "(2.50, 3.0)", "(2.5,3)", "(2.5,30)"),
    ("thousands separators", "1{,}000", "1000", "100"),
    ("variable on the left", "x = 4", "4", "5"),
    ("leading zero", ".75", "0.75", "0.57"),
    ("a/b", "3/4", "\\frac{3}{4}", "\\frac{4}{3}"),
    ("equal values", "\\frac{2}{4}", "0.5", "0.25"),
    ("unicode minus", "\u22122", "-2", "2"),
    ("trailing period", "9.", "9", "0.9"),
]


@pytest.mark.parametrize("rule,form,canonical,near_miss", MATH_RULES, ids=[r[0] for r in MATH_RULES])
def test_math_normalization_rule(rule, form, canonical, near_miss):
  assert math_answer.math_answers_equal(form, canonical), rule
  assert math_answer.math_answers_equal(canonical, form), rule
  assert not math_answer.math_answers_equal(form, near_miss), rule
  # Through the reward too: a boxed completion against a gold solution.
  assert math_answer.math_equal(f"so \\boxed{{{form}}}.", f"hence $\\boxed{{{canonical}}}$")


def test_outer_braces_of_two_groups_are_kept():
  assert math_answer.normalize_math_answer("{1}{2}") == "{1}{2}"
  assert not math_answer.math_answers_equal("2^{10}", "2^10")   # a multi-digit exponent keeps its braces

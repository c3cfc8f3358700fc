from fractions import Fraction

import pytest

from grpo_jax.rewards import countdown, evaluate_expression, get_reward, make_countdown_reward
from grpo_jax.rewards.countdown import InvalidExpression, countdown_score

NUMS = [25, 5, 4, 7]


@pytest.mark.parametrize("answer,target,expected", [
    ("(25 - 5) * 4", 80, 1.0),
    ("(25-5)*4 = 80", 80, 1.0),            # a trailing "= value" is allowed
    ("25 * 4 - 5 * 4", 80, 0.0),           # 4 used twice
    ("25 + 5", 30, 1.0),                   # unused numbers are allowed
    ("25 + 5 + 5", 35, 0.0),               # 5 reused
    ("25 + 6", 31, 0.0),                   # 6 is not given
    ("7 * 4 - 25 + 5", 8, 1.0),            # all four
    ("(25 + 7) / 4", 8, 1.0),              # exact division
    ("7 / 4 * (25 - 5)", 35, 1.0),         # rational intermediate 7/4
    ("25 / 4 * 4", 25, 0.0),               # 4 reused
    ("25 / 5 / 4", 1, 0.0),                # 5/4, not 1
    ("7 / (5 - 5)", 0, 0.0),               # division by zero (and reuse)
    ("(4 - 4) / 7", 0, 0.0),               # reuse of 4
    ("25 / (5 - 5 + 0)", 0, 0.0),          # 0 is not given
    ("-(5 - 25) * 4", 80, 1.0),            # unary minus
    ("25 \u00d7 4 \u2212 5 \u00f7 5", 99, 0.0),  # 5 reused
    ("25 \u00d7 4 \u2212 5", 95, 1.0),           # unicode operators
    ("25 ** 2", 625, 0.0),                 # power is not allowed
    ("2.5 * 4", 10, 0.0),                  # decimals are not allowed
    ("25 + x", 25, 0.0),
    ("__import__('os').system('true')", 0, 0.0),
    ("(25 + 5", 30, 0.0),
    ("25 + 5)", 30, 0.0),
    ("", 0, 0.0),
])
def test_countdown_cases(answer, target, expected):
  completion = f"<think>let me try</think><answer>{answer}</answer>"
  assert countdown([""], [completion], numbers=[NUMS], target=[target]) == [expected]


def test_answer_tag_required_and_last_one_counts():
  assert countdown_score("(25 - 5) * 4", NUMS, 80) == 0.0
  assert countdown_score("<answer>25</answer> no: <answer>(25 - 5) * 4</answer>", NUMS, 80) == 1.0


def test_require_all_and_format_score():
  strict = make_countdown_reward(require_all=True, format_score=0.1)
  completions = ["<answer>25 + 5</answer>", "<answer>7 * 4 - 25 + 5</answer>", "<answer>7*4-25+5+1</answer>",
                 "<answer>7 * 4 - 25 - 5</answer>"]
  assert strict([""] * 4, completions, numbers=[NUMS] * 4, target=[30, 8, 9, 8]) == [0.0, 1.0, 0.0, 0.1]
  assert get_reward("countdown_all_numbers")([""], completions[:1], numbers=[NUMS], target=[30]) == [0.0]


def test_evaluator_against_fraction_arithmetic():
  assert evaluate_expression("1 + 2 * 3 - 4 / 8") == (Fraction(1) + 2 * 3 - Fraction(4, 8), [1, 2, 3, 4, 8])
  assert evaluate_expression("(1 + 2) * (3 - 4) / 8")[0] == Fraction(-3, 8)
  assert evaluate_expression("10 - 4 - 3")[0] == 3  # left associative
  assert evaluate_expression("64 / 4 / 2")[0] == 8
  assert evaluate_expression("--3")[0] == 3


@pytest.mark.parametrize("text", ["1 +", "()", "1 2", "(" * 100 + "1" + ")" * 100, "-" * 200 + "1", "1" * 600,
                                  "1 // 2", "1;2"])
def test_invalid_expressions(text):
  with pytest.raises(InvalidExpression):
    evaluate_expression(text)


def test_bad_numbers_column_is_an_error():
  with pytest.raises(TypeError, match="numbers must be a sequence of integers"):
    countdown([""], ["<answer>1</answer>"], numbers=["[1, 2]"], target=[1])

import pytest

from grpo_jax.rewards import format_lenient, format_strict, gate_on_format, get_reward, make_format_reward

GOOD = "<think>\n2 + 2 = 4\n</think>\n<answer>\n4\n</answer>"


@pytest.mark.parametrize("completion,strict,lenient", [
    (GOOD, True, True),
    ("<think>x</think><answer>4</answer>", True, True),
    ("  <think>x</think>\n\n<answer>4</answer>\n", True, True),
    ("Sure! <think>x</think><answer>4</answer>", False, True),          # text before
    ("<think>x</think><answer>4</answer> Hope this helps", False, True),  # text after
    ("<think>x</think> so <answer>4</answer>", False, True),             # text between
    ("<think>x</think><answer>  </answer>", False, False),               # blank answer
    ("<answer>4</answer><think>x</think>", False, False),                # wrong order
    ("<think>x</think><answer>4</answer><answer>5</answer>", False, True),
    ("<think><think>x</think><answer>4</answer>", False, True),
    ("<think>x</think>", False, False),
    ("<answer>4</answer>", False, False),
    ("<think>x<answer>4</answer>", False, False),                        # think never closed
    ("", False, False),
])
def test_strict_and_lenient(completion, strict, lenient):
  assert format_strict([""], [completion]) == [float(strict)]
  assert format_lenient([""], [completion]) == [float(lenient)]


def test_think_prefilled_by_the_prompt():
  completion = "2 + 2 = 4</think><answer>4</answer>"
  assert format_strict([""], [completion]) == [0.0]
  assert get_reward("format_strict_prefilled")([""], [completion]) == [1.0]
  assert make_format_reward(strict=False, think_prefilled=True)([""], ["<think>" + completion]) == [1.0]


def test_gate_on_format():
  completions = ["<think>x</think><answer>4</answer>", "the answer is 4", "<think>x</think><answer>5</answer>",
                 "<think>x</think><answer>4</answer>"]
  gated = gate_on_format("gsm8k_accuracy", "format_strict", otherwise=-1.0)
  assert gated([""] * 4, completions, answer=["4", "4", "4", "#### 7"]) == [1.0, -1.0, 0.0, 0.0]
  assert get_reward("gsm8k_accuracy")([""] * 2, completions[:2], answer=["4", "4"]) == [1.0, 1.0]
  lenient = gate_on_format("exact_match", format_lenient)
  assert lenient([""], ["<think>a</think><answer>b</answer>"], answer=["<think>a</think><answer>b</answer>"]) == [1.0]


def test_gate_passes_none_through():
  never = lambda prompts, completions, **cols: [None] * len(completions)
  assert gate_on_format(never)([""] * 2, ["x", "<think>a</think><answer>b</answer>"]) == [None, None]

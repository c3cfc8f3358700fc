"""The default experiment's data: the addition task and the character tokenizer."""
from __future__ import annotations

import pytest

from grpo_jax.data.char_tokenizer import EOS_ID, PAD_ID, CharTokenizer
from grpo_jax.data.synthetic import AdditionTask


def test_char_tokenizer_round_trip_and_errors():
  tok = CharTokenizer("0123456789+=")
  assert tok.vocab_size == 14
  assert tok.encode("12+3=") == [3, 4, 12, 5, 13]
  # decode stops at the stop token and skips padding
  assert tok.decode([PAD_ID, 3, 4, EOS_ID, 5]) == "12"
  with pytest.raises(ValueError, match="'x'"):
    tok.encode("1x")
  with pytest.raises(ValueError, match="outside the vocabulary"):
    tok.decode([99])


def test_addition_rows_are_correct_deterministic_and_resumable():
  task = AdditionTask(num_digits=2, seed=3)
  rows = task.train_rows(0, 200)
  for prompt, answer in zip(rows["prompt"], rows["answer"]):
    a, b = prompt[:-1].split("+")
    assert prompt.endswith("=") and int(answer) == int(a) + int(b) and 0 <= int(a) < 100
  # Row i depends only on (seed, i): any window of the stream is reproducible from its start position.
  assert task.train_rows(50, 10) == {k: v[50:60] for k, v in rows.items()}
  assert AdditionTask(2, seed=4).train_rows(0, 200) != rows


def test_held_out_problems_never_appear_in_training_and_do_not_depend_on_the_seed():
  task = AdditionTask(num_digits=2, heldout_fraction=0.1, seed=0)
  held = task.eval_rows(256)
  assert len(set(held["prompt"])) == 256
  assert held == AdditionTask(2, 0.1, seed=7).eval_rows(256)
  train = set(task.train_rows(0, 20000)["prompt"])
  assert not train & set(held["prompt"])
  assert len(train) > 8000  # nearly all of the 9,000 training problems are reachable
  with pytest.raises(ValueError, match="exceeds"):
    task.eval_rows(5000)

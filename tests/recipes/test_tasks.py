"""The dataset task (prompt stream, held-out rows, dropping over-long prompts, stop ids), reward gates and
the dataset config checks. No model runs here."""
from __future__ import annotations

import collections

import numpy as np
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from grpo_jax.data.char_tokenizer import CharTokenizer
from grpo_jax.settings import Settings
from grpo_jax.testing import gsm8k_records, write_jsonl
from grpo_jax.data.tasks import DatasetTask, load_hf_tokenizer, make_task, stop_ids
from grpo_jax.train.build import build_reward_fns
from grpo_jax.train import checks
from tests.recipes.conftest import load_experiment

LONG_QUESTION = "How many apples are there if " + " and ".join(f"box {i} holds {i} apples" for i in range(80)) + "?"


def _gsm8k_config(train_path, heldout_path=""):
  c = load_experiment("gsm8k")("test")
  c.task.train_path = train_path
  c.task.heldout_path = heldout_path
  return c


def test_over_long_prompt_is_dropped_and_counted(fixture_paths, tmp_path):
  records = gsm8k_records()
  train = write_jsonl(str(tmp_path / "train.jsonl"), records[:10] + [{"question": LONG_QUESTION,
                                                                       "answer": "x\n#### 3240"}])
  heldout = write_jsonl(str(tmp_path / "test.jsonl"), records[10:])
  lines = []
  task = make_task(Settings.from_config(_gsm8k_config(train, heldout)), log=lines.append)

  tokenizer = load_hf_tokenizer(fixture_paths["checkpoint"])
  long_text = tokenizer.apply_chat_template([{"role": "user", "content": LONG_QUESTION}], tokenize=False,
                                            add_generation_prompt=True)
  long_len = len(tokenizer(long_text, add_special_tokens=False)["input_ids"])
  assert long_len > 192  # the premise: this prompt alone exceeds the limit of the test preset
  assert task.num_dropped == {"train": 1, "heldout": 0}
  assert (task.num_train, task.num_heldout) == (10, len(records) - 10)
  assert len(lines) == 1 and "dropped 1 prompts longer than sampling.max_prompt_length=192 tokens" in lines[0]
  # Three epochs of the stream: every kept row exactly 3 times, the long one never.
  stream = task.train_rows(0, 30)
  counts = collections.Counter(stream["question"])
  assert LONG_QUESTION not in counts
  assert sorted(counts) == sorted(r["question"] for r in records[:10]) and set(counts.values()) == {3}
  # Every prompt fits and re-encodes to at most max_prompt_length tokens.
  assert max(len(tokenizer(p, add_special_tokens=False)["input_ids"]) for p in stream["prompt"]) <= 192


def test_train_stream_is_a_function_of_seed_and_position(fixture_paths):
  c = _gsm8k_config(fixture_paths["gsm8k"])
  task = make_task(Settings.from_config(c), log=lambda _: None)
  n = task.num_train
  full = task.train_rows(0, 3 * n)
  again = make_task(Settings.from_config(c), log=lambda _: None)
  assert again.train_rows(5, 2 * n) == {k: v[5:5 + 2 * n] for k, v in full.items()}  # resume mid-epoch
  epochs = [full["question"][i * n:(i + 1) * n] for i in range(3)]
  assert all(sorted(e) == sorted(epochs[0]) for e in epochs) and epochs[0] != epochs[1]
  heldout = set(task.eval_rows(100)["question"])
  assert len(heldout) == task.num_heldout == 4 and not heldout & set(epochs[0])
  # Reward columns travel with the prompt: the gold number of each row.
  gold = {r["question"]: r["answer"].rsplit("####", 1)[1].strip().replace(",", "") for r in gsm8k_records()}
  assert all(gold[q] == a for q, a in zip(full["question"], full["answer"]))
  c.seed = 1
  assert make_task(Settings.from_config(c), log=lambda _: None).train_rows(0, n)["question"] != epochs[0]


def test_stop_ids(fixture_paths):
  tokenizer = load_hf_tokenizer(fixture_paths["checkpoint"])
  eos, im_end = tokenizer.convert_tokens_to_ids("<|endoftext|>"), tokenizer.convert_tokens_to_ids("<|im_end|>")
  assert tokenizer.eos_token_id == eos and stop_ids(tokenizer) == (eos, im_end)
  tokenizer.eos_token = "<|im_end|>"  # an instruct checkpoint: eos is the end-of-turn token, listed once
  assert stop_ids(tokenizer) == (im_end, eos)
  assert stop_ids(CharTokenizer("0123")) == (1,)


def test_bos_is_written_into_the_prompt_text_when_the_tokenizer_adds_one():
  words = ["[UNK]", "<s>", "</s>", "what", "is", "2", "+", "?"]
  core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
  core.pre_tokenizer = pre_tokenizers.Whitespace()
  core.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
  tok = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>", eos_token="</s>", unk_token="[UNK]")
  rows = [{"prompt": "what is 2 + 2 ?", "answer": "4"}] * 2
  task = DatasetTask(rows, rows, tok, max_prompt_tokens=7)  # BOS + 6 words: fits exactly
  prompt = task.train_rows(0, 1)["prompt"][0]
  assert prompt == "<s>what is 2 + 2 ?"
  assert tok(prompt, add_special_tokens=False)["input_ids"] == [1, 3, 4, 5, 6, 5, 7]
  with pytest.raises(ValueError, match="all 2 training prompts are longer than .*max_prompt_length=6"):
    DatasetTask(rows, rows, tok, max_prompt_tokens=6)


def test_reward_gate_scores_accuracy_only_with_the_format(fixture_paths):
  c = load_experiment("countdown")("test")
  fns = {name: (fn, w) for name, fn, w in build_reward_fns(Settings.from_config(c))}
  assert {name: w for name, (_, w) in fns.items()} == {"countdown": 1.0, "format_strict_prefilled": 0.1}
  completions = [" 3+4 is 7 </think> <answer>3 + 4</answer>",  # right, in format
                 " <answer>3 + 4</answer>",                    # right, but the think block never closes
                 " 3*4 </think> <answer>3 * 4</answer>",       # in format, wrong value
                 " 3+3 </think> <answer>3 + 3 + 1</answer>"]   # reuses 3: invalid
  cols = {"numbers": [[3, 4, 1]] * 4, "target": [7] * 4}
  gated, _ = fns["countdown"]
  assert gated(["p"] * 4, completions, **cols) == [1.0, 0.0, 0.0, 0.0]
  from grpo_jax.rewards import get_reward
  assert get_reward("countdown")(["p"] * 4, completions, **cols) == [1.0, 1.0, 0.0, 0.0]


@pytest.mark.parametrize("change, key", [
    (lambda c: setattr(c.task, "train_path", ""), "config.task.train_path"),
    (lambda c: setattr(c.task, "train_path", "/nonexistent/train.jsonl"), "config.task.train_path"),
    (lambda c: setattr(c.task, "heldout_path", "/nonexistent/test.jsonl"), "config.task.heldout_path"),
    (lambda c: setattr(c.model, "hf_path", ""), "config.model.hf_path"),
    (lambda c: setattr(c.task, "template", "alpaca"), "config.task.template"),
    (lambda c: setattr(c.task, "template", "plain"), "config.task.system_prompt"),
    (lambda c: c.reward_gates.update({"exact_match": "format_strict"}), "config.reward_gates.exact_match"),
    (lambda c: c.reward_gates.update({"gsm8k_accuracy": "no_such_format"}), "config.reward_gates.gsm8k_accuracy"),
])
def test_dataset_config_errors_name_the_key(fixture_paths, change, key):
  c = load_experiment("gsm8k")("test")
  checks.validate(c)
  change(c)
  with pytest.raises(ValueError, match=key.replace(".", r"\.")):
    checks.validate(c)


def test_recipe_presets_validate_and_use_published_settings():
  for name in ("gsm8k", "countdown"):
    c = load_experiment(name)(None)
    assert c.task.name == "dataset" and c.model.dtype == "bfloat16" and c.model.param_dtype == "float32"
    assert c.optim.learning_rate == 1e-6 and c.sampling.temperature == 1.0
    with pytest.raises(ValueError, match=r"config\.task\.train_path"):  # the user must point at local data
      checks.validate(c)
  assert load_experiment("gsm8k")("1.5b").task.template == "chat"
  assert load_experiment("countdown")("0.5b").task.prefill_think
  with pytest.raises(ValueError, match="unknown preset"):
    load_experiment("countdown")("huge")
  np.testing.assert_equal(load_experiment("gsm8k")(None).grpo.beta, 0.04)

"""The recipes' `:test` presets end to end: a tiny random Qwen2 (or Gemma 3, Qwen3-MoE, gpt-oss) checkpoint loaded
from disk with its tokenizer, fixture data in GSM8K / Countdown layout, template, sampling, rewards, 2 GRPO updates,
a checkpoint."""
from __future__ import annotations

import json
import os

import pytest

from grpo_jax.settings import Settings
from grpo_jax.data.datasets import DatasetError
from grpo_jax.testing import gsm8k_records, write_jsonl
from grpo_jax.train import loop
from grpo_jax.persist.metrics import read_jsonl
from tests.recipes.conftest import load_experiment

RECIPES = {
    "gsm8k": {"rewards": ("gsm8k_accuracy", "format_strict"), "prompt_start": "<|im_start|>system\n"},
    "countdown": {"rewards": ("countdown", "format_strict_prefilled"), "prompt_start": "A conversation between"},
    "smollm2_arithmetic": {"rewards": ("gsm8k_accuracy",), "prompt_start": "<|im_start|>"},
    "gym": {"rewards": ("reasoning_gym_full_credit",), "prompt_start": "<|im_start|>system\nGive only the final answer"},
    "gemma3_arithmetic": {"rewards": ("first_line_match",), "prompt_start": "<bos>23 + 41 = 64\n",
                          "checkpoint": "gemma3_checkpoint"},
    "gemma3_gsm8k": {"rewards": ("reasoning_format", "reasoning_format_tags", "reasoning_answer_graded",
                                 "reasoning_answer_number"),
                     "prompt_start": "<bos><start_of_turn>user\nYou are given a problem.",
                     "checkpoint": "gemma3_checkpoint"},
    "qwen3_moe_gsm8k": {"rewards": ("gsm8k_accuracy", "format_strict"), "prompt_start": "<|im_start|>system\n",
                        "checkpoint": "qwen3_moe_checkpoint"},
    "gpt_oss_gsm8k": {"rewards": ("gsm8k_accuracy", "answer_tag"), "prompt_start": "<|im_start|>system\nSolve the",
                      "checkpoint": "gpt_oss_checkpoint"},
    "qwen3_5_gsm8k": {"rewards": ("gsm8k_accuracy", "format_strict"), "prompt_start": "<|im_start|>system\n",
                      "checkpoint": "qwen3_5_checkpoint"},
    "gemma4_gsm8k": {"rewards": ("gsm8k_accuracy", "format_strict"), "prompt_start": "<bos><start_of_turn>user\n",
                     "checkpoint": "gemma4_checkpoint"},
}
# What a `:test` preset may change: sizes, counts, data sources and logging. Every other field is structure
# (remat, dtypes, beta and the reference, the loss, the template, the rewards...) and must stay the recipe's.
SIZE_FIELDS = {
    "num_steps", "model.hf_path", "model.logprob_chunk_size", "task.train_path", "task.heldout_path",
    "task.heldout_fraction", "task.max_rows", "task.train_size", "task.heldout_size", "sampling.max_prompt_length", "sampling.max_new_tokens",
    "grpo.group_size", "grpo.prompts_per_step", "grpo.mini_batch_size", "grpo.micro_batch_size",
    "optim.learning_rate", "optim.warmup_steps", "eval.every", "eval.size", "eval.batch_size",
    "checkpoint.every", "model.hidden_size", "model.intermediate_size", "model.num_layers", "model.num_heads",
    "model.num_kv_heads", "model.head_dim", "model.vocab_size", "model.max_position_embeddings",
    "warmstart.batch_size", "warmstart.max_steps", "warmstart.eval_every", "warmstart.target_accuracy",
    # The device mesh: a multi-GPU recipe's (fsdp 8 for the MoE recipes) cannot lay out on the one CPU device a
    # :test preset runs on; the same program on fewer devices (tests/distributed checks the equality).
    "mesh.data", "mesh.fsdp", "mesh.tensor", "mesh.expert",
}


def _needs_extra(name):
  if name == "gym":
    pytest.importorskip("reasoning_gym")   # the [gym] extra (in the test extra, so CI has it)


def _leaves(config, prefix=""):
  out = {}
  for key, value in config.items():
    if hasattr(value, "items") and key not in ("rewards", "reward_gates", "field_map"):
      out.update(_leaves(value, f"{prefix}{key}."))
    else:
      out[prefix + key] = value.to_dict() if hasattr(value, "to_dict") else value
  return out


def _batch_structure(config):
  """(several mini-batches per rollout?, several micro-batches per mini-batch?)"""
  settings = Settings.from_config(config)
  rollout, mini = settings.rollout_batch_size, settings.mini_batch_size
  return rollout // mini > 1, mini // settings.micro_batch_size > 1


@pytest.mark.parametrize("name", sorted(RECIPES) + ["default", "lora", "calculator"])
def test_test_preset_changes_sizes_never_structure(name, fixture_paths):
  _needs_extra(name)
  full, test = load_experiment(name)(None), load_experiment(name)("test")
  full_leaves, test_leaves = _leaves(full), _leaves(test)
  assert full_leaves.keys() == test_leaves.keys()
  changed = {k for k in full_leaves if full_leaves[k] != test_leaves[k] and not k.startswith("log.")}
  assert changed <= SIZE_FIELDS, f"the :test preset changes structural fields {sorted(changed - SIZE_FIELDS)}"
  assert _batch_structure(test) == _batch_structure(full)


# The model families' recipes run from tests/recipes/test_family_recipes.py: a file of their own, which the suite's
# workers (--dist loadfile) run beside this one.
FAMILY_RECIPES = ("qwen3_moe_gsm8k", "gpt_oss_gsm8k", "qwen3_5_gsm8k", "gemma4_gsm8k")


@pytest.mark.parametrize("name", sorted(set(RECIPES) - set(FAMILY_RECIPES)))
def test_test_preset_runs_two_steps_and_checkpoints(name, fixture_paths, compile_cache, tmp_path, capsys):
  check_test_preset_run(name, fixture_paths, tmp_path, capsys)


def check_test_preset_run(name, fixture_paths, tmp_path, capsys):
  """Recipe `name`'s :test preset: 2 GRPO steps, metrics, checkpoints, samples and its prompt as RECIPES says."""
  _needs_extra(name)
  config = load_experiment(name)("test")
  assert config.model.hf_path == fixture_paths[RECIPES[name].get("checkpoint", "checkpoint")]
  # A reward that varies between random completions, so the update has a non-zero gradient.
  config.rewards["recipes_test_digit_fraction"] = 0.5
  workdir = str(tmp_path / name)
  summary = loop.train(config, workdir)

  assert summary.steps == 2
  records = read_jsonl(os.path.join(workdir, "metrics.jsonl"))
  assert [r["step"] for r in records] == [0, 1, 2]
  for rec in records[1:]:
    for fn in RECIPES[name]["rewards"] + ("recipes_test_digit_fraction",):
      assert f"rewards/{fn}/mean" in rec and f"rewards/{fn}/std" in rec
    assert {"reward", "reward_std", "loss", "grad_norm", "completions/mean_length"} <= set(rec)
    assert ("kl" in rec) == (config.grpo.beta > 0)
  assert any(rec["grad_norm"] > 0 for rec in records[1:])
  assert "eval/accuracy" in records[0] and "eval/accuracy" in records[-1]
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["0", "2"]

  with open(os.path.join(workdir, "samples.jsonl")) as f:
    samples = [json.loads(line) for line in f]
  prompt = samples[0]["prompt"]
  assert prompt.startswith(RECIPES[name]["prompt_start"])
  if name == "countdown":
    assert prompt.endswith("Assistant: <think>")
  if config.task.answer_only:
    assert prompt.endswith("<|im_start|>assistant\n<answer>")
  out = capsys.readouterr().out
  if config.task.name.startswith("reasoning_gym:"):
    assert "held-out questions that are also training questions" in out
    # the floor a task's accuracy is read against, logged at step 0 and in the start line
    assert 0 < records[0]["eval/constant_answer"] <= 1 and "one constant answer would score" in out
  else:
    assert "eval/constant_answer" not in records[0]
  if config.task.name == "dataset":
    assert "dropped 0 prompts longer than sampling.max_prompt_length=192 tokens" in out
  for name in filter(None, config.task.transfer.split(",")):  # transfer sets: evaluated at the first and last step
    assert f"transfer/{name}/accuracy" in records[0] and f"transfer/{name}/accuracy" in records[-1]


def test_malformed_row_stops_the_run_naming_file_and_row(fixture_paths, tmp_path):
  records = gsm8k_records()
  del records[2]["answer"]
  path = write_jsonl(str(tmp_path / "bad_gsm8k.jsonl"), records)
  config = load_experiment("gsm8k")("test")
  config.task.train_path = path
  with pytest.raises(DatasetError, match=r"bad_gsm8k\.jsonl, line 3: .*'answer'"):
    loop.train(config, str(tmp_path / "run"))


def test_fixtures_built_from_the_command_line_are_found_by_the_presets(tmp_path):
  # docs/guide.md's route: python -m grpo_jax.testing DIR, then GRPO_JAX_FIXTURES=DIR for the presets.
  import subprocess
  import sys
  directory = str(tmp_path / "fixtures")
  subprocess.run([sys.executable, "-m", "grpo_jax.testing", directory], check=True, capture_output=True,
                 timeout=300)
  with pytest.MonkeyPatch.context() as mp:
    mp.setenv("GRPO_JAX_FIXTURES", directory)
    config = load_experiment("gsm8k")("test")
  assert config.model.hf_path == os.path.join(directory, "tiny_qwen2")
  assert config.task.train_path == os.path.join(directory, "gsm8k.jsonl")

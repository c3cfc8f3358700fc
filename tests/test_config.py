"""The base config and its validation: every bad setting stops the run before any compile, naming the key."""
from __future__ import annotations

import glob
import os
import re
import subprocess
import sys

import pytest

from grpo_jax import config as config_lib
from grpo_jax.settings import Settings
from grpo_jax.train import checks
from tests.train.conftest import ROOT, load_experiment


def _config(**overrides):
  c = load_experiment("default")()
  for key, value in overrides.items():
    node = c
    *parents, leaf = key.split(".")
    for p in parents:
      node = node[p]
    node[leaf] = value
  return c


def test_default_experiment_and_presets_validate():
  checks.validate(load_experiment("default")())
  checks.validate(load_experiment("default")("test"))
  with pytest.raises(ValueError, match="unknown preset 'nope'"):
    load_experiment("default")("nope")


@pytest.mark.parametrize("overrides, key, message", [
    ({"grpo.mini_batch_size": 48}, "grpo.mini_batch_size", "does not divide the rollout batch"),
    ({"grpo.mini_batch_size": 64, "grpo.micro_batch_size": 24}, "grpo.micro_batch_size", "does not divide"),
    ({"sampling.max_new_tokens": 30}, "sampling.max_new_tokens", "exceeds the model's context"),
    ({"grpo.group_size": 1}, "grpo.group_size", "must be >= 2"),
    ({"grpo.aggregation": "sum"}, "grpo.aggregation", "not one of"),
    ({"grpo.advantage": "ppo"}, "grpo.advantage", "not one of"),
    ({"grpo.kl_estimator": "k4"}, "grpo.kl_estimator", "not one of"),
    ({"grpo.std_ddof": 2}, "grpo.std_ddof", "not one of"),
    ({"grpo.policy_loss": "no_such_loss"}, "grpo.policy_loss", "unknown policy loss"),
    ({"rewards": {"no_such_reward": 1.0}}, "rewards.no_such_reward", "unknown reward"),  # named first
    ({"rewards": {"format_strict": 1.0}}, "eval.accuracy_reward", "not one of the configured rewards"),
    ({"rewards": {"exact_match": 1.0, "no_such_reward": 0.5}}, "rewards.no_such_reward", "unknown reward"),
    ({"reward_funcs": ("no_such_package.rewards:f",)}, "reward_funcs", "unknown reward function .*cannot import"),
    ({"reward_funcs": ("tests.rewards.isolation_rewards:pid",), "reward_weights": (1.0, 2.0)}, "reward_weights",
     "2 weights for 1 reward_funcs"),
    ({"reward_funcs": ("exact_match",)}, "reward_funcs", "names a reward twice"),
    ({"sampling.temperature": 0.0}, "sampling.temperature", "must be > 0"),
    ({"sampling.top_p": 1.5}, "sampling.top_p", "must be in"),
    ({"grpo.delta": 0.5}, "grpo.delta", "must be > 1"),
    ({"grpo.top_entropy_quantile": 0.0}, "grpo.top_entropy_quantile", "must be in"),
    ({"num_steps": 0}, "num_steps", "must be >= 1"),
    ({"optim.schedule": "linear"}, "optim.schedule", "not one of"),
    ({"model.num_kv_heads": 3}, "model.num_kv_heads", "does not divide"),
    ({"warmstart.init_checkpoint": "/nonexistent/run"}, "warmstart.init_checkpoint", "is not a directory"),
    ({"eval.batch_size": 0}, "eval.batch_size", "must be >= 1"),
    ({"eval.temperature": 0.0}, "eval.temperature", "must be > 0"),
    ({"eval.pass_k": (1, 16), "eval.samples": 8}, "eval.pass_k", "asks for k = 16 .* set eval.samples >= 16"),
    ({"eval.maj_k": (4,)}, "eval.maj_k", "asks for k = 4 from eval.samples = 0"),
    ({"eval.pass_k": (0,), "eval.samples": 4}, "eval.pass_k", "must be a tuple of positive ints"),
    ({"checkpoint.keep": 0}, "checkpoint.keep", "must be >= 1"),
    ({"log.wandb_mode": "disabled"}, "log.wandb_mode", "not one of"),
    ({"mesh.tensor": 0}, "mesh.tensor", "must be >= 1"),
    ({"mesh.data": 0}, "mesh.data", "must be >= 1 .or -1"),
    ({"grpo.length_buckets": 0}, "grpo.length_buckets", "must be >= 1"),
])
def test_inconsistent_settings_name_the_key(overrides, key, message):
  # config.<key>=<value>: <what is allowed> (grpo_jax/config_checks.py)
  with pytest.raises(ValueError, match=f"config.{key}(=.*)?: .*{message}"):
    checks.validate(_config(**overrides))


def test_dynamic_sampling_is_accepted_and_needs_at_least_one_round():
  checks.validate(_config(**{"grpo.dynamic_sampling": True}))
  with pytest.raises(ValueError, match="config.grpo.dynamic_sampling_max_rounds=0: must be >= 1"):
    checks.validate(_config(**{"grpo.dynamic_sampling": True, "grpo.dynamic_sampling_max_rounds": 0}))


def test_locked_config_rejects_unknown_keys_and_wrong_types():
  c = load_experiment("default")()
  c.lock()
  with pytest.raises(AttributeError, match="betta"):
    c.grpo.betta = 0.0
  with pytest.raises(TypeError):
    c.num_steps = "many"
  c.grpo.epsilon_high = 0.28  # a None default with a declared type accepts a float ...
  with pytest.raises(TypeError):
    c.grpo.epsilon_high = "high"  # ... and nothing else


def test_every_experiment_file_starts_with_its_command():
  files = sorted(glob.glob(os.path.join(ROOT, "experiments", "*.py")))
  assert files
  for path in files:
    with open(path) as f:
      lines = f.read().splitlines()
    header = []
    for line in lines:  # the leading comment block
      if not line.startswith("#"):
        break
      header.append(line)
    assert header, f"{path} does not begin with a comment"
    assert any(("python scripts/" in line or "bash scripts/" in line) for line in header), (
        f"{path}: the leading comment gives no command that runs it")


@pytest.mark.parametrize("flag, message", [
    ("--config.grpo.betta=0", "betta"),
    ("--config.num_steps=many", "num_steps"),
    ("--config.grpo.mini_batch_size=5", "config.grpo.mini_batch_size=5: does not divide"),
    ("--config.reward_funcs=no_such_package.rewards:f", "config.reward_funcs: unknown reward function"),
    ("--config.model.hf_path=/no/such/model", "model.hf_path"),
])
def test_launcher_stops_before_compiling(flag, message, tmp_path):
  workdir = tmp_path / "run"
  proc = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "train.py"), "--config",
                         os.path.join(ROOT, "experiments", "default.py:test"), flag, "--workdir", str(workdir)],
                        capture_output=True, text=True, timeout=120, cwd=ROOT)
  # A user error: one line naming it, exit code 2 (grpo_jax/errors.py; the sweep runners do not retry it).
  assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
  assert message in proc.stderr.strip().splitlines()[-1], proc.stderr[-2000:]
  assert not (workdir / "checkpoints").exists()


def test_rewards_by_import_path_with_dots():
  """ml_collections refuses dots in the keys of `rewards`; `reward_funcs` takes import paths (and names)."""
  from grpo_jax.train import build
  from tests.rewards import isolation_rewards
  c = _config(reward_funcs=("tests.rewards.isolation_rewards:pid", "gsm8k_accuracy"), reward_weights=(0.5, 2.0))
  fns = build.build_reward_fns(checks.validate(c))
  assert [(name, weight) for name, _, weight in fns] == [
      ("exact_match", 1.0), ("tests.rewards.isolation_rewards:pid", 0.5), ("gsm8k_accuracy", 2.0)]
  assert fns[1][1] is isolation_rewards.pid
  c = _config(reward_funcs=("tests.rewards.isolation_rewards:pid",))
  assert Settings.from_config(c).configured_rewards["tests.rewards.isolation_rewards:pid"] == 1.0


def test_a_saved_config_gets_the_fields_it_predates_at_their_defaults():
  """scripts/evaluate.py and scripts/export.py read a run's config.json with today's code: a group added since
  (here `env`) takes its defaults, the saved values stay, and name -> value maps are the saved ones."""
  import json
  saved = json.loads(config_lib.get_config().to_json_best_effort())
  del saved["env"]
  del saved["model"]["lora_rank"]
  saved["rewards"] = {"gsm8k_accuracy": 1.0}
  saved["num_steps"] = 7
  saved["optim"]["learning_rate"] = 1  # an int where the default is a float
  config = config_lib.saved_with_defaults(saved)
  assert config.env.name == "" and config.model.lora_rank == 0 and config.num_steps == 7
  assert dict(config.rewards) == {"gsm8k_accuracy": 1.0} and config.optim.learning_rate == 1


def test_an_unknown_key_gets_the_closest_keys():
  message = config_lib.unknown_key_message
  assert "did you mean config.task.heldout_fraction or" in message("task.holdout_fraction")
  assert "did you mean config.optim.eps?" in message("eps")
  assert "did you mean" not in message("grpo.zzz") and "\n" not in message("grpo.epsilon")
  assert "optim.learning_rate" in config_lib.keys() and "optim" in config_lib.keys()


@pytest.mark.parametrize("overrides, message", [
    ({"task.template": "chat"}, "config.task.template='chat': only dataset, reasoning_gym, word_arithmetic tasks "
                                "read task.template, not 'addition' (leave it at its default 'plain')"),
    ({"task.min_terms": 2}, "config.task.min_terms=2: only chain_sum tasks read task.min_terms, not 'addition'"),
    ({"task.tool_fraction": 0.9}, "config.task.tool_fraction=0.9: only tool_arithmetic tasks read"),
])
def test_a_task_key_the_named_task_does_not_read_is_refused(overrides, message):
  """config.task is the union of the tasks' keys: one the named task would ignore must keep its default."""
  with pytest.raises(ValueError, match="^" + re.escape(message)):
    checks.validate(_config(**overrides))


def test_every_task_key_is_read_by_some_task_and_each_task_declares_what_it_reads():
  from grpo_jax.data import tasks
  takers = {key: [name for name in tasks.TASKS if key in tasks.TASKS.get(name).takes] for key in tasks.task_keys()}
  assert not [key for key, names in takers.items() if not names]  # no key of config.task that no task reads
  assert tasks.TASKS.get("addition").takes == {"num_digits", "heldout_fraction"}
  with pytest.raises(ValueError, match=r"register_task\('mine'\): takes \['num_digit'\], not keys of config.task"):
    tasks.register_task("mine", takes=("num_digit",))(lambda settings, tokenizer, log: None)

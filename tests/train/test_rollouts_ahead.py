"""Rollouts ahead of the update (`rollout.staleness` = k): the loop's pending batches against a reference loop
written here from the definition (batch t is sampled with step t's key by the parameters after max(0, t-1-k)
updates), and what a checkpoint keeps of them. Kill and signal points with pending batches:
tests/train/test_faults.py."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax import errors
from grpo_jax.train import checks
from grpo_jax.train.inputs import RunInputs
from grpo_jax.train.loop import train
from grpo_jax.train.rollout import restored_rollout, saved_rollout
from grpo_jax.train.run import Run
from tests.train.conftest import ROOT, load_experiment
from tests.virtual_devices import env_with_devices

NUM_STEPS = 5
COMPARED = ("reward", "loss", "grad_norm", "completions/mean_length", "offpolicy/ratio", "offpolicy/ratio_std",
            "logp_mismatch", "rollout/staleness")


def even_length(prompts, completions, **unused):
  """A reward the untrained tiny model meets about half the time, so every update moves the policy."""
  return [float(len(c) % 2 == 0) for c in completions]


def _config(staleness: int):
  c = load_experiment("default")("test")
  c.num_steps, c.warmstart.enabled, c.rewards, c.eval.accuracy_reward = NUM_STEPS, False, {}, "even_length"
  c.optim.learning_rate = 3e-2  # large steps: a batch sampled by the wrong parameters shows in every metric
  c.eval.every, c.checkpoint.every, c.log.plot, c.log.tensorboard = 100, 100, False, False
  c.reward_isolation = "thread"
  c.rollout.staleness = staleness
  return c


def _copy(tree):
  return jax.tree.map(jnp.copy, tree)


def _reference(config, staleness: int) -> list[dict]:
  """The metrics of steps 1..NUM_STEPS by the definition, with the run's own parts."""
  inputs = RunInputs((even_length,))
  run = Run(checks.validate(config, reward_callables=["even_length"]), inputs, log=lambda *a, **k: None)
  state = run.new_state(_copy(run.initial_params), 0, 0, {}, "")
  policies = [_copy(state.params)]  # policies[u]: the parameters after u updates
  rows = []
  for t in range(1, NUM_STEPS + 1):
    version = max(0, t - 1 - staleness)
    rollout, position = run.sample(policies[version], state.data_position, t)
    rollout.metrics["rollout/policy_step"] = version
    state = state._replace(data_position=position)
    state, metrics = run.update(state, run.prepare(rollout, state, t), t)
    policies.append(_copy(state.params))
    rows.append({**rollout.metrics, **metrics})
  return [{k: float(r[k]) for k in COMPARED} for r in rows]


def _logged(workdir) -> list[dict]:
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  return [{k: r[k] for k in COMPARED} for r in rows if r.get("step", 0) > 0 and "event" not in r]


@pytest.mark.parametrize("staleness", [0, 1, 2])
def test_the_loop_equals_the_definition(staleness, tmp_path):
  config = _config(staleness)
  train(config, str(tmp_path), reward_funcs=[even_length])
  logged = _logged(tmp_path)
  assert [r["rollout/staleness"] for r in logged] == [min(t - 1, staleness) for t in range(1, NUM_STEPS + 1)]
  assert logged == _reference(config, staleness)
  if staleness:  # the policy moved between sampling and update: the ratio to the behaviour policy spreads
    assert logged[-1]["offpolicy/ratio_std"] > 1e-3 and logged[-1]["logp_mismatch"] > 1e-3
  else:
    assert all(r["logp_mismatch"] < 1e-5 for r in logged)


def test_a_longer_resumed_run_is_the_same_run(tmp_path):
  """Pending batches past num_steps are sampled too, so raising num_steps on a resume changes nothing: the short
  run's last checkpoint holds the batches of steps 4 and 5, which the resume restores (kill and signal points
  with pending batches: tests/train/test_faults.py, under the faults marker)."""
  straight, resumed = tmp_path / "straight", tmp_path / "resumed"
  train(_config(2), str(straight), reward_funcs=[even_length])
  short = _config(2)
  short.num_steps = 3
  train(short, str(resumed), reward_funcs=[even_length])
  train(_config(2), str(resumed), reward_funcs=[even_length])
  assert _logged(resumed) == _logged(straight)


def test_a_pending_rollout_survives_its_saved_form():
  rng = np.random.default_rng(0)
  from grpo_jax.train.rollout import Rollout
  from grpo_jax.train.step import RolloutBatch
  batch = RolloutBatch(rng.integers(0, 9, (4, 3), dtype=np.int32), np.ones((4, 3), np.int32),
                       rng.integers(0, 9, (4, 2), dtype=np.int32), np.ones((4, 2), np.int32),
                       rng.normal(size=4).astype(np.float32), rng.normal(size=(4, 2)).astype(np.float32), None)
  rollout = Rollout(batch, {"reward": np.float32(0.25), "rewards/x/failures": 1}, ["a"] * 4, ["b", "c", "d", "e"],
                    np.arange(4, dtype=np.float32), 20)
  arrays, info = saved_rollout(rollout)
  back = restored_rollout(arrays, json.loads(json.dumps(info)))  # through the checkpoint's JSON
  for a, b in zip(back.batch, batch):
    assert (a is None and b is None) or (a.dtype == b.dtype and np.array_equal(a, b))
  assert back.metrics == {"reward": 0.25, "rewards/x/failures": 1} and back.completions == rollout.completions
  assert np.array_equal(back.rewards_B, rollout.rewards_B) and back.num_tokens == 20


def test_staleness_is_checked():
  config = _config(0)
  config.rollout.staleness = -1
  with pytest.raises(errors.ConfigError, match=r"config.rollout.staleness=-1: must be >= 0"):
    checks.validate(config)
  config.rollout.staleness, config.rollout.sampler_devices = 0, 1
  with pytest.raises(errors.ConfigError, match=r"config.rollout.sampler_devices=1: needs rollout.staleness >= 1"):
    checks.validate(config)
  config.rollout.staleness = 1  # one CPU device here: none left for the update
  settings = checks.validate(config, reward_callables=["even_length"])
  with pytest.raises(errors.ConfigError, match=r"sampler_devices=1: leaves no device for the update"):
    Run(settings, RunInputs((even_length,)), log=lambda *a, **k: None)


def _launch(workdir, devices: int, experiment: str, *overrides: str) -> list[dict]:
  """`experiment`'s test preset with staleness 1, launched on `devices` virtual CPU devices; its metrics without
  timings, and the final checkpoint's state fingerprint."""
  env = env_with_devices(devices)
  env.pop("JAX_COMPILATION_CACHE_DIR", None)
  proc = subprocess.run(
      [sys.executable, "scripts/train.py", "--config", f"experiments/{experiment}.py:test",
       "--config.rollout.staleness=1", "--config.warmstart.enabled=False", "--config.log.plot=False",
       "--config.log.tensorboard=False", "--workdir", str(workdir), *overrides],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  rows = [{k: v for k, v in json.loads(line).items() if not k.startswith("timing/") and k not in (
      "step_time", "tokens_per_s")} for line in open(os.path.join(workdir, "metrics.jsonl"))]
  with open(os.path.join(workdir, "checkpoints", "4", "meta", "metadata")) as f:
    return rows + [json.load(f)["state_fingerprint"]]


@pytest.mark.parametrize("experiment, overrides, exercised", [
    # Rewards that move the policy, and DAPO's dynamic sampling: a second sampler call in every step.
    ("default", ('--config.reward_funcs=("tests.train.fault_runner:even_length",)',
                 "--config.optim.learning_rate=0.03", "--config.grpo.dynamic_sampling=True"),
     "dynamic_sampling/rounds"),
    # Multi-turn episodes with a tool (47 s for the pair, so on demand: pytest -m slow).
    pytest.param("calculator", (), "episodes/turns", marks=pytest.mark.slow),
])
def test_overlapped_rollouts_equal_inline_ones(experiment, overrides, exercised, tmp_path):
  """The sampler on a device of its own (rollout.sampler_devices = 1 of 2), sampling during the update, gives the
  run of one device sampling before it: the same trainer mesh (one device) and a sampler mesh of the same shape."""
  overlapped = _launch(tmp_path / "overlapped", 2, experiment, *overrides, "--config.rollout.sampler_devices=1")
  inline = _launch(tmp_path / "inline", 1, experiment, *overrides)
  assert overlapped == inline
  steps = [r for r in inline[:-1] if r.get("step", 0) > 0 and "event" not in r]
  assert max(r[exercised] for r in steps) > 1  # the path under test ran: a second sampler call, a second turn
  if experiment == "default":
    assert len({r["reward"] for r in steps}) > 1  # the policy moved: a batch of the wrong policy would show

"""Rollouts ahead of the update (`rollout.staleness` = k): the loop's pending batches against a reference loop
written here from the definition (batch t is sampled with step t's key by the parameters after max(0, t-1-k)
updates), and what a checkpoint keeps of them. Kill and signal points with pending batches:
tests/train/test_faults.py."""
from __future__ import annotations

import json
import os
from pathlib import Path

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
from grpo_jax.train.timing import STEP_PHASES
from tests.train.conftest import load_experiment
from tests.virtual_devices import run_worker

STEP_PARTS = set(STEP_PHASES)

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
    rollout, position = run.producer.sample(policies[version], state.data_position, t)
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
  config.rollout.sampler_tensor = 2  # the sampler's own layout must divide its devices
  with pytest.raises(errors.ConfigError, match=r"config.rollout.sampler_tensor=2: does not divide "
                                               r"rollout.sampler_devices=1"):
    checks.validate(config)
  config.rollout.sampler_devices, config.rollout.sampler_tensor, config.mesh.fsdp = 0, 1, 2  # one device here
  with pytest.raises(errors.ConfigError, match=r"^config.mesh: 1 devices are not divisible by fsdp\*tensor\*expert=2 "
                                               r"\(the trainer's devices: 1 of 1, rollout.sampler_devices=0\)"):
    Run(checks.validate(config, reward_callables=["even_length"]), RunInputs((even_length,)), log=lambda *a, **k: None)


WORKER = Path(__file__).parent / "overlap_worker.py"


def _worker_run(workdir, devices: int, experiment: str) -> tuple[list[dict], list[dict], str, list]:
  """tests/train/overlap_worker.py's run of `experiment` on `devices` virtual CPU devices, overlapped when 2:
  (its metrics rows, the same without timings, the final checkpoint's state fingerprint, its clock stamps)."""
  mode = "overlapped" if devices == 2 else "inline"
  events = run_worker(WORKER, str(workdir), mode, experiment, devices=devices)["events"]
  rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
  untimed = [{k: v for k, v in r.items() if not k.startswith("timing/") and k not in ("step_time", "tokens_per_s")}
             for r in rows]
  with open(os.path.join(workdir, "checkpoints", "4", "meta", "metadata")) as f:
    return rows, untimed, json.load(f)["state_fingerprint"], events


def _sampled_during_updates(events) -> list[bool]:
  """Per update: whether a sampler prefill ran between its dispatch and its end (the worker's stamps; the end is
  the earlier of the waiting thread's stamp, which can come late, and Run.update's return)."""
  first_after = lambda name, t: min(x for n, x in events if n == name and x > t)  # noqa: E731
  prefills = [t for name, t in events if name == "prefill"]
  dispatches = [t for name, t in events if name == "update_dispatch"]
  ends = [min(first_after("update_end", d), first_after("update_returned", d)) for d in dispatches]
  return [any(d < t < e for t in prefills) for d, e in zip(dispatches, ends)]


def _check_timing(rows: list[dict], workdir) -> None:
  """Each step's timing/* parts are >= 0 and add up to its step_time; summary.json's split agrees."""
  steps = [r for r in rows if r.get("step", 0) > 0 and "event" not in r]
  for r in steps:
    parts = {k: v for k, v in r.items() if k in STEP_PARTS}
    assert min(parts.values()) >= -1e-9 and sum(parts.values()) == pytest.approx(r["step_time"], abs=1e-6), r
  with open(os.path.join(workdir, "summary.json")) as f:
    split = json.load(f)["time_split_s"]
  for key, name in STEP_PHASES.items():
    assert split.get(name, 0.0) == pytest.approx(sum(r.get(key, 0.0) for r in steps), abs=0.01), name


@pytest.mark.parametrize("experiment, exercised", [
    # Rewards that move the policy, and DAPO's dynamic sampling: a second sampler call in every step.
    ("default", "dynamic_sampling/rounds"),
    # Multi-turn episodes with a tool (~45 s for the pair, so on demand: pytest -m slow).
    pytest.param("calculator", "episodes/turns", marks=pytest.mark.slow),
])
def test_overlapped_rollouts_equal_inline_ones_and_overlap(experiment, exercised, tmp_path):
  """The sampler on a device of its own (rollout.sampler_devices = 1 of 2), sampling during the update, gives the
  run of one device sampling before it (the same trainer mesh, a sampler mesh of the same shape); it reads no
  array from the trainer's device (run under transfer_guard_device_to_device("disallow")), and its programs for
  the next batch run while the update does, which inline they do not."""
  rows, overlapped, fingerprint, events = _worker_run(tmp_path / "overlapped", 2, experiment)
  inline_rows, inline, inline_fingerprint, inline_events = _worker_run(tmp_path / "inline", 1, experiment)
  assert overlapped == inline and fingerprint == inline_fingerprint
  steps = [r for r in inline if r.get("step", 0) > 0 and "event" not in r]
  assert max(r[exercised] for r in steps) > 1  # the path under test ran: a second sampler call, a second turn
  if experiment == "default":
    assert len({r["reward"] for r in steps}) > 1  # the policy moved: a batch of the wrong policy would show
  assert _sampled_during_updates(events) == [True] * 4
  assert _sampled_during_updates(inline_events) == [False] * 4
  _check_timing(rows, tmp_path / "overlapped")
  _check_timing(inline_rows, tmp_path / "inline")
  assert min(r["timing/sync_s"] for r in rows if r.get("step", 0) > 0 and "event" not in r) > 0

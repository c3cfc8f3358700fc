"""Rollouts that span updates (`rollout.decode_budget`, grpo_jax/train/partial.py): every completion token is
sampled by the policy its schedule names, min(p0 + i // B, t - 1) updates, as a decode written here from the
definition gives it; and a run stopped anywhere (SIGKILL or SIGTERM, during the inline sampling or the
overlapped one, resumed in either mode) ends as the uninterrupted inline run does, which overlapped runs equal.
The run: tests/train/partial_runner.py (staleness 2, budget 1 of 4 tokens, 5 steps, a checkpoint every step)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax import errors
from grpo_jax.errors import EXIT_PREEMPTED
from grpo_jax.persist.metrics import read_jsonl
from grpo_jax.train import checks
from grpo_jax.train import producer as producer_lib
from grpo_jax.train import run as run_lib
from grpo_jax.train.loop import train
from grpo_jax.train.rollout import encode_prompts
from tests.train import partial_runner
from tests.train.conftest import ROOT
from tests.train.partial_runner import BUDGET, NUM_STEPS, STALENESS
from tests.virtual_devices import env_with_devices


def _outcome(workdir) -> tuple:
  """(final step, its state fingerprint, data position, metrics without timings)."""
  directory = os.path.join(workdir, "checkpoints")
  step = max(int(d) for d in os.listdir(directory) if d.isdigit())
  with open(os.path.join(directory, str(step), "meta", "metadata")) as f:
    meta = json.load(f)
  timing = lambda k: k.startswith("timing/") or k in ("step_time", "tokens_per_s")  # noqa: E731
  metrics = [{k: v for k, v in r.items() if not timing(k)} for r in read_jsonl(os.path.join(workdir, "metrics.jsonl"))
             if "event" not in r]
  return step, meta["state_fingerprint"], meta["data_position"], metrics


def _scheduled(t: int, C: int) -> np.ndarray:
  """[C]: the policy step of each token of batch t by the definition."""
  first = max(0, t - 1 - STALENESS)
  return np.minimum(first + np.arange(C) // BUDGET, t - 1)


def _by_definition(producer, policies: dict, t: int):
  """Batch t's (tokens, log-probs) decoded here piece by piece, the policy of each piece from `_scheduled`."""
  spec, G, R = producer.rollout_spec, producer.rollout_spec.group_size, producer.settings.grpo.prompts_per_step
  prompts = encode_prompts(producer.tokenizer, producer.task.train_rows((t - 1) * R, R)["prompt"],
                           spec.max_prompt_length)
  batch_key = jax.random.fold_in(jax.random.key(producer.settings.seed), t)
  keys = np.stack([np.asarray(jax.random.key_data(jax.random.fold_in(batch_key, r))) for r in range(R * G)])
  sampler = producer.sampler.sampler
  C = sampler.cfg.max_new_tokens
  tokens, logp = [[] for _ in range(R * G)], [[] for _ in range(R * G)]
  rows, piece = np.arange(R * G), 0
  while len(rows):
    policy = min(max(0, t - 1 - STALENESS) + piece, t - 1)
    budget = None if policy == t - 1 else BUDGET
    if piece == 0:
      out = sampler.generate(policies[policy], prompts, None, repeats=G, row_keys=keys, budget=budget)
    else:
      out = sampler.generate(policies[policy], [prompts[r // G] for r in rows], None, row_keys=keys[rows],
                             prefixes=[tokens[r] for r in rows], budget=budget)
    for i, r in enumerate(rows):
      tokens[r] += out.completion_BxC[i, out.start_B[i]:out.lengths_B[i]].tolist()
      logp[r] += out.logp_BxC[i, out.start_B[i]:out.lengths_B[i]].tolist()
    rows, piece = rows[out.unfinished_B], piece + 1
  pad = lambda xs, fill: np.array([x + [fill] * (C - len(x)) for x in xs])  # noqa: E731
  return pad(tokens, sampler.cfg.pad_id), pad(logp, 0.0).astype(np.float32)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
  """The inline run in this process, each batch checked against `_by_definition`: its outcome."""
  workdir = tmp_path_factory.mktemp("uninterrupted")
  policies, batches, producers = {}, [], []
  sync, prepare = producer_lib.Producer.sync, run_lib.Run.prepare

  def recording_sync(self, params, step):  # the policy after `step` updates (the update donates it: a copy)
    policies[step], producers[:] = jax.tree.map(jnp.copy, params), [self]
    return sync(self, params, step)

  def recording_prepare(self, rollout, state, step):
    batches.append((step, rollout))
    return prepare(self, rollout, state, step)

  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(producer_lib.Producer, "sync", recording_sync)
    patch.setattr(run_lib.Run, "prepare", recording_prepare)
    train(partial_runner.config(), str(workdir))
  outcome = _outcome(workdir)
  assert [t for t, _ in batches] == list(range(1, NUM_STEPS + 1))
  for (t, rollout), row in zip(batches, outcome[3][1:]):
    mask_BxC = rollout.batch.completion_mask_BxC > 0
    expected_BxC = np.where(mask_BxC, _scheduled(t, mask_BxC.shape[1])[None], -1)
    assert np.array_equal(rollout.policy_BxC, expected_BxC), t
    tokens, logp = _by_definition(producers[0], policies, t)
    assert np.array_equal(np.where(mask_BxC, rollout.batch.completion_BxC, -1), np.where(mask_BxC, tokens, -1)), t
    assert np.array_equal(rollout.batch.sampler_logp_BxC, logp), t
    steps = expected_BxC[mask_BxC]
    assert (row["rollout/policy_step_min"], row["rollout/policy_step_max"]) == (steps.min(), steps.max())
    assert row["rollout/policy_step_mean"] == pytest.approx(steps.mean())
    assert row["rollout/staleness"] == min(t - 1, STALENESS)
  # batches that spanned updates, and a policy that moved (a token of the wrong policy would show)
  assert [r["rollout/policy_step_max"] - r["rollout/policy_step_min"] for r in outcome[3][1:]] == [0, 1, 2, 2, 2]
  assert len({r["reward"] for r in outcome[3][1:]}) > 1
  return outcome


def test_each_token_is_sampled_by_its_scheduled_policy(uninterrupted):
  assert uninterrupted[0] == NUM_STEPS


def _run(workdir, sampler_devices: int, *point) -> subprocess.CompletedProcess:
  env = env_with_devices(1 + sampler_devices) if sampler_devices else dict(os.environ)
  # A session of its own: the signal must not reach pytest.
  return subprocess.run([sys.executable, "-m", "tests.train.partial_runner", str(workdir), str(sampler_devices),
                         *map(str, point)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
                        start_new_session=True)


# Each case: the stops of one workdir, in order ((sampler devices, the segment of that process, action)), then
# the run to the end on `finish` sampler devices. A SIGKILL loses the step in progress; a SIGTERM saves at once.
CHAINS = {
    # inline: killed in step 2's sampling (batch 2 finished, batch 3 advancing), resumed from step 1 and signalled
    # in step 3's sampling (its 5th segment: batch 4 advancing), resumed from step 2 with batches 3, 4 in flight
    "inline": ([(0, 5, "kill"), (0, 5, "term")], 0),
    # overlapped: killed during update 2 (batch 4 starting), resumed from step 1 overlapped; signalled during
    # update 3 (its 5th segment, batch 4 advancing) and that segment never ends: step 3 saved at once with the
    # sampler's policy; resumed inline
    "overlapped": ([(1, 6, "kill"), (1, 5, "term_stall")], 0),
}


@pytest.mark.parametrize("name", list(CHAINS))
def test_a_stopped_run_resumes_to_the_uninterrupted_inline_run(name, uninterrupted, tmp_path):
  stops, finish = CHAINS[name]
  for devices, nth, action in stops:
    stopped = _run(tmp_path, devices, nth, action)
    assert stopped.returncode == (-signal.SIGKILL if action == "kill" else EXIT_PREEMPTED), stopped.stderr[-3000:]
    if action == "term_stall":
      assert "step 3 saved during the rollout of the next" in stopped.stdout + stopped.stderr
  resumed = _run(tmp_path, finish)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert _outcome(tmp_path) == uninterrupted


def test_what_it_does_not_support_is_refused_in_one_line():
  def refused(**changes):
    config = partial_runner.config()
    for key, value in changes.items():
      section, name = key.split("__")
      setattr(getattr(config, section), name, value)
    with pytest.raises(errors.ConfigError) as raised:
      checks.validate(config)
    assert "\n" not in str(raised.value)
    return str(raised.value)
  assert refused(rollout__staleness=0).startswith("config.rollout.decode_budget=1: needs rollout.staleness >= 1")
  assert refused(rollout__decode_budget=-1).startswith("config.rollout.decode_budget=-1: must be >= 0")
  for key, name in [("grpo__dynamic_sampling", "grpo.dynamic_sampling"), ("moe__routing_replay", "moe.routing_replay"),
                    ("distributed__num_processes", "distributed.num_processes")]:
    value = 2 if name.endswith("processes") else True
    assert refused(**{key: value}).startswith(f"config.rollout.decode_budget=1: is not supported with {name}")
  assert refused(env__name="calculator").startswith("config.rollout.decode_budget=1: is not supported with env.name")

"""DAPO dynamic sampling (rollout.collect_dynamic_rollout) with a fake sampler: zero-std groups are dropped,
further prompt blocks are sampled until the batch is full of groups with signal, and a batch still short after
max_rounds is filled with zero-advantage groups. The end-to-end run (resume, compile counts) is in test_loop."""
from __future__ import annotations

import jax
import numpy as np
import pytest

from grpo_jax.data.char_tokenizer import CharTokenizer
from grpo_jax.sampling.sampler import SampleResult
from grpo_jax.train import rollout as rollout_lib
from tests.tolerance import assert_close_f32

G, P, N = 4, 6, 3
TOKENIZER = CharTokenizer("abcdefghijklmnopqrstuvwxyz0123456789")


class FakeSampler:
  """Row i of a call completes with (i % G) + 1 letters 'a' and the stop token; counts calls and shapes."""

  def __init__(self):
    self.shapes = []
    self.keys = []

  def generate(self, params, prompts, key, repeats=1):
    prompts = [ids for ids in prompts for _ in range(repeats)]
    B = len(prompts)
    prompt_BxP = np.zeros((B, P), np.int32)
    prompt_mask_BxP = np.zeros((B, P), np.int32)
    for i, ids in enumerate(prompts):
      prompt_BxP[i, P - len(ids):] = ids
      prompt_mask_BxP[i, P - len(ids):] = 1
    lengths_B = (np.arange(B) % G + 1).astype(np.int32)
    completion_BxC = np.zeros((B, N + 1), np.int32)
    mask_BxC = np.zeros((B, N + 1), np.int32)
    a = TOKENIZER.encode("a")[0]
    for i, n in enumerate(lengths_B):
      completion_BxC[i, :n - 1] = a
      completion_BxC[i, n - 1] = TOKENIZER.eos_token_id
      mask_BxC[i, :n] = 1
    self.shapes.append((B, P))
    self.keys.append(np.asarray(jax.random.key_data(key)).tolist())
    return SampleResult(prompt_BxP, prompt_mask_BxP, completion_BxC, mask_BxC, -0.5 * mask_BxC.astype(np.float32),
                        lengths_B, np.zeros(B, bool))


def kind_reward(prompts, completions, kind, **_):
  """'const' prompts: every completion scores 0; 'signal' prompts: the completion's length parity."""
  return [0.0 if k == "const" else float(len(c) % 2) for c, k in zip(completions, kind)]


def _blocks(kinds_per_block):
  """next_columns() over blocks of prompts named p<index>, and the list of positions it was called at."""
  position = [0]
  rows = [k for block in kinds_per_block for k in block]
  per = len(kinds_per_block[0])

  def next_columns():
    start = position[0]
    position[0] += per
    kinds = rows[start:start + per]
    return {"prompt": [f"p{start + i}" for i in range(len(kinds))], "kind": kinds}
  return next_columns, position


def _collect(next_columns, max_rounds, advantage="grpo"):
  sampler = FakeSampler()
  settings = rollout_lib.RolloutSpec(group_size=G, max_prompt_length=P,
                                         scoring=rollout_lib.Scoring([("kind", kind_reward, 1.0)], 10.0, 0.0,
                                                                     "thread"),
                                         advantage=advantage, std_ddof=1, advantage_eps=1e-4, mask_truncated=False)
  out = rollout_lib.collect_dynamic_rollout(sampler, None, TOKENIZER, next_columns, settings, jax.random.key(7),
                                            max_rounds=max_rounds)
  return out, sampler


def _grpo_advantages(rewards_B):  # float64 reference
  r = np.asarray(rewards_B, np.float64).reshape(-1, G)
  return ((r - r.mean(1, keepdims=True)) / (r.std(1, ddof=1, keepdims=True) + 1e-4)).reshape(-1)


def test_zero_std_groups_are_replaced_by_groups_from_further_rounds():
  C, S = "const", "signal"
  next_columns, position = _blocks([[C, S, C, C], [S, C, S, S], [S, S, S, S], [S, S, S, S]])
  out, sampler = _collect(next_columns, max_rounds=4)
  # Round 1 has 1 group with signal, round 2 three more: 4 = prompts_per_step after two rounds, no third call.
  assert out.metrics["dynamic_sampling/rounds"] == 2
  assert out.metrics["dynamic_sampling/kept_groups"] == 4
  assert out.metrics["dynamic_sampling/filled_groups"] == 0
  assert position[0] == 8  # two blocks of prompts consumed: the data position the checkpoint stores
  assert out.metrics["frac_reward_zero_std"] == pytest.approx(4 / 8)  # before filtering: 4 of 8 sampled groups
  assert out.prompts == [p for p in ("p1", "p4", "p6", "p7") for _ in range(G)]
  rewards_RxG = out.rewards_B.reshape(-1, G)
  assert np.all(rewards_RxG.max(1) > rewards_RxG.min(1))  # only groups with signal are trained on
  assert_close_f32(out.batch.advantages_B, _grpo_advantages(out.rewards_B), ulps=16)  # 0.07 seen, 10 old atol
  assert out.batch.prompt_BxP.shape == (4 * G, P) and out.batch.completion_BxC.shape == (4 * G, N + 1)
  # Same shapes every call (no new compilation); round r samples with fold_in(key, r), round 0 with the key.
  assert sampler.shapes == [(4 * G, P)] * 2
  expected_keys = [jax.random.key(7), jax.random.fold_in(jax.random.key(7), 1)]
  assert sampler.keys == [np.asarray(jax.random.key_data(k)).tolist() for k in expected_keys]
  # The batch rows are the sampled rows of those groups (prompt and completion stay paired).
  lengths = out.batch.completion_BxC.shape[1] - (out.batch.completion_BxC == 0).sum(1)
  assert [len(c) for c in out.completions] == list(lengths - 1)


def test_a_batch_still_short_after_max_rounds_is_filled_with_zero_advantage_groups():
  C, S = "const", "signal"
  next_columns, position = _blocks([[C, S, C, C], [C, C, S, C], [S, S, S, S]])
  out, sampler = _collect(next_columns, max_rounds=2, advantage="batch")
  assert out.metrics["dynamic_sampling/rounds"] == 2 and len(sampler.shapes) == 2 and position[0] == 8
  assert out.metrics["dynamic_sampling/kept_groups"] == 2
  assert out.metrics["dynamic_sampling/filled_groups"] == 2
  assert out.metrics["frac_reward_zero_std"] == pytest.approx(6 / 8)
  # Signal groups first (sampling order), then the earliest zero-std groups fill the static batch shape.
  assert out.prompts == [p for p in ("p1", "p6", "p0", "p2") for _ in range(G)]
  adv_RxG = out.batch.advantages_B.reshape(-1, G)
  assert np.all(adv_RxG[2:] == 0) and np.all(np.abs(adv_RxG[:2]).max(1) > 0.1)


def test_selection_keeps_signal_groups_in_order_and_fills_with_the_earliest_zero_std_ones():
  groups, kept = rollout_lib.select_signal_groups(np.array([True, False, True, False, False, True]), 2)
  assert groups.tolist() == [1, 3] and kept == 2
  groups, kept = rollout_lib.select_signal_groups(np.array([True, False, True]), 3)
  assert groups.tolist() == [1, 0, 2] and kept == 1
  with pytest.raises(ValueError, match="2 sampled groups cannot fill a batch of 3 groups"):
    rollout_lib.select_signal_groups(np.array([True, True]), 3)


def test_rounds_with_different_prompt_widths_concatenate_left_padded():
  """Each sampler call pads prompts to its own longest; the rounds' groups join at the widest width."""
  def scored(width, token):
    sample = SampleResult(np.full((2, width), token, np.int32), np.ones((2, width), np.int32),
                          np.full((2, 3), token, np.int32), np.ones((2, 3), np.int32), np.zeros((2, 3), np.float32),
                          np.full(2, 3, np.int32), np.zeros(2, bool))
    return rollout_lib.Scored(sample, ["p", "p"], ["c", "c"], np.zeros(2, np.float32), {"r": np.zeros(2)}, {},
                  np.zeros(1), np.ones(1, bool))
  joined = rollout_lib.concat_scored([scored(2, 7), scored(4, 9)])
  np.testing.assert_array_equal(joined.sample.prompt_BxP, [[0, 0, 7, 7]] * 2 + [[9] * 4] * 2)
  np.testing.assert_array_equal(joined.sample.prompt_mask_BxP, [[0, 0, 1, 1]] * 2 + [[1] * 4] * 2)
  np.testing.assert_array_equal(joined.sample.completion_BxC, [[7] * 3] * 2 + [[9] * 3] * 2)

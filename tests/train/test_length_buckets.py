"""The update on padding cut to bucket widths (grpo.length_buckets) computes what the full-width update does."""
from __future__ import annotations

import jax
import numpy as np
import optax
import pytest
from flax import nnx

from grpo_jax.algo.objective import LossConfig
from grpo_jax.model import ModelConfig, Transformer
from grpo_jax.train.rollout import bucket_width, bucket_widths, trim_padding
from grpo_jax.train.step import RolloutBatch, make_train_step
from tests.tolerance import assert_close_f32

pytestmark = pytest.mark.usefixtures("float32_matmuls")

B, P, N = 8, 24, 32
CFG = ModelConfig(vocab_size=14, hidden_size=16, intermediate_size=32, num_layers=2, num_heads=2, num_kv_heads=2,
                  head_dim=8, max_position_embeddings=64)


@pytest.mark.parametrize("used,maximum,buckets,width", [
    (13, 48, 4, 16), (16, 48, 4, 16), (17, 48, 4, 24), (25, 48, 4, 40), (41, 48, 4, 48), (48, 48, 4, 48),
    (3, 4, 4, 4), (100, 192, 4, 144), (1, 512, 4, 128), (129, 512, 4, 256), (30, 48, 1, 48), (5, 48, 2, 24)])
def test_bucket_width(used, maximum, buckets, width):
  assert bucket_width(used, maximum, buckets) == width


def test_bucket_widths():
  assert bucket_widths(48, 4) == (16, 24, 40, 48)
  assert bucket_widths(256, 4) == (64, 128, 192, 256)
  assert bucket_widths(8, 4) == (8,)      # the default experiment: one prompt width, as before
  assert bucket_widths(48, 1) == (48,)


def test_prompt_width_follows_the_widths_of_max_prompt_length():
  """The sampler pads prompts to bucket widths of max_prompt_length; trimming with the same maximum keeps
  that width (no further update shapes), where buckets of the batch's own width would cut it again."""
  batch = _batch(longest_prompt=10, longest_completion=N)   # P = 24 = bucket_width(10, 96, 4)
  assert trim_padding(batch, buckets=4, max_prompt_length=96).prompt_BxP.shape == (B, 24)
  assert trim_padding(batch, buckets=4).prompt_BxP.shape == (B, 16)


def _batch(longest_prompt: int, longest_completion: int, seed=0) -> RolloutBatch:
  """Left-padded prompts of 2..longest_prompt tokens, completions of 1..longest_completion tokens (one row each
  at the longest), and tokens after each completion's end as the sampler leaves them (masked, not zero)."""
  rng = np.random.default_rng(seed)
  prompt_len = rng.integers(2, longest_prompt + 1, B)
  prompt_len[0] = longest_prompt
  comp_len = rng.integers(1, longest_completion + 1, B)
  comp_len[1] = longest_completion
  prompt_mask = (np.arange(P)[None] >= P - prompt_len[:, None]).astype(np.int32)
  prompt = rng.integers(2, CFG.vocab_size, (B, P)).astype(np.int32) * prompt_mask
  comp_mask = (np.arange(N)[None] < comp_len[:, None]).astype(np.int32)
  completion = rng.integers(1, CFG.vocab_size, (B, N)).astype(np.int32)
  sampler_logp = -rng.uniform(0.5, 3.0, (B, N)).astype(np.float32)
  return RolloutBatch(prompt, prompt_mask, completion, comp_mask, rng.normal(size=B).astype(np.float32),
                      sampler_logp, -rng.uniform(0.5, 3.0, (B, N)).astype(np.float32))


@pytest.mark.parametrize("aggregation", ["seq_mean_token_mean", "seq_mean_token_sum_norm"])
def test_trimmed_update_equals_the_full_width_update(aggregation):
  batch = _batch(longest_prompt=10, longest_completion=13)
  trimmed = trim_padding(batch, buckets=4)
  assert trimmed.prompt_BxP.shape == (B, 16) and trimmed.completion_BxC.shape == (B, 16)
  assert trim_padding(batch, buckets=1) is batch

  graphdef, params = nnx.split(Transformer(CFG, rngs=nnx.Rngs(0)))
  loss_cfg = LossConfig(beta=0.04, aggregation=aggregation, max_completion_length=N)
  step = jax.jit(make_train_step(graphdef, optax.adam(1e-2), loss_cfg, num_iterations=2, mini_batch_size=4,
                                 micro_batch_size=2, temperature=0.9, chunk_size=8))
  opt_state = optax.adam(1e-2).init(params)
  full = step(params, opt_state, batch)
  cut = step(params, opt_state, trimmed)
  # Padding cut off: each parameter leaf within 256 ulps of its largest (1 seen; the old atol at leaves of ~0.07),
  # each metric, a mean over tokens of terms of size ~1, within 32 ulps of max(1, |value|) (equal here; the old
  # atol is 17).
  assert_close_f32(full[0], cut[0], ulps=256)
  for name in full[2]:
    assert_close_f32(float(full[2][name]), float(cut[2][name]), ulps=32, scale=max(1.0, abs(float(cut[2][name]))),
                     err_msg=name)


def test_nothing_to_cut_and_everything_masked():
  batch = _batch(longest_prompt=P, longest_completion=N)
  assert trim_padding(batch, buckets=4) is batch
  empty = batch._replace(completion_mask_BxC=np.zeros_like(batch.completion_mask_BxC))
  assert trim_padding(empty, buckets=4).completion_BxC.shape == (B, 8)

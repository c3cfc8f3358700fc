"""Decode segments (SamplingConfig.decode_segment): the loop attends to the cache slots filled by each segment's
end instead of all of them; the tokens and log-probs must be those of one segment, for global attention and
for Gemma 3's sliding-window rings, which grow with the cache until they reach their window."""
from __future__ import annotations

import dataclasses
import re

import jax
import numpy as np
import pytest
from flax import nnx

from grpo_jax.model import ModelConfig, Transformer
from grpo_jax.model.config import FULL, SLIDING
from grpo_jax.sampling import Sampler, SamplingConfig
from grpo_jax.sampling.sampler import decode_segments
from tests.tolerance import assert_close_f32


def test_segments_cover_every_step_with_the_slots_it_attends_to():
  assert decode_segments(10, 24, 0) == [(24, 34)]
  assert decode_segments(10, 24, 24) == [(24, 34)]
  assert decode_segments(10, 24, 8) == [(8, 18), (16, 26), (24, 34)]
  assert decode_segments(10, 20, 8) == [(8, 18), (16, 26), (20, 30)]
  for P, C, L in [(3, 17, 4), (16, 64, 5)]:
    segments, start = decode_segments(P, C, L), 1
    for end, width in segments:
      for t in range(start, end):      # step t writes slot P + t - 1 and attends to slots <= it
        assert P + t - 1 < width
      start = end
    assert segments[-1] == (C, P + C)


def _model(sliding: bool):
  cfg = ModelConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                    head_dim=8, max_position_embeddings=128)
  if sliding:  # Gemma 3's layout: a sliding layer (window 6, shorter than the cache) then a global one
    cfg = dataclasses.replace(cfg, family="gemma3_text", qk_norm=True, tie_word_embeddings=True,
                              layer_types=(SLIDING, FULL), sliding_window=6, query_pre_attn_scalar=8.0)
  return nnx.split(Transformer(cfg, rngs=nnx.Rngs(params=jax.random.key(3))))


# Two of the four pairings (all four pass: `-m slow` runs the others).
@pytest.mark.parametrize("sliding,greedy", [(False, False), (True, True),
                                            pytest.param(False, True, marks=pytest.mark.slow),
                                            pytest.param(True, False, marks=pytest.mark.slow)])
def test_segments_give_the_tokens_and_log_probs_of_one_segment(sliding, greedy):
  graphdef, state = _model(sliding)
  prompts = [[5, 9, 11, 2], [7, 3], [40, 41, 42, 43, 44, 45, 46]]
  key = jax.random.key(0)
  out = {}
  for segment in (0, 5):
    cfg = SamplingConfig(max_new_tokens=23, temperature=0.7, greedy=greedy, pad_id=0, decode_segment=segment)
    sampler = Sampler(graphdef, cfg, prompt_bucket_min=8)
    out[segment] = sampler.generate(state, prompts, key, repeats=2)
    assert sampler.trace_counts["decode"] == 1
  np.testing.assert_array_equal(out[5].completion_BxC, out[0].completion_BxC)
  np.testing.assert_array_equal(out[5].completion_mask_BxC, out[0].completion_mask_BxC)
  assert_close_f32(out[5].logp_BxC, out[0].logp_BxC, ulps=64)  # 1.9 ulps of the largest seen, 39 the old atol
  assert out[0].lengths_B.max() == 23  # random weights: no row stops, every segment runs


def test_each_segment_loop_carries_a_cache_of_its_own_width():
  """The lowered decode has one while loop per segment, each carrying keys of P + end slots (the check fails
  when the loop runs on the whole cache)."""
  graphdef, state = _model(False)
  cfg = SamplingConfig(max_new_tokens=23, pad_id=0, decode_segment=5)
  sampler = Sampler(graphdef, cfg, prompt_bucket_min=8)
  lowered, decode = [], sampler._decode

  def keep_lowered(*args, **kwargs):
    lowered.append(decode.lower(*args, **kwargs).as_text())
    return decode(*args, **kwargs)

  sampler._decode = keep_lowered
  sampler.generate(state, [[5, 9, 11, 2]], jax.random.key(0))
  P = 8  # prompt_bucket_min
  loops = [line for line in lowered[0].splitlines() if "stablehlo.while" in line]  # each segment's, and inner
  widths = {int(w) for line in loops for w in re.findall(r"tensor<1x2x8x(\d+)xf32>", line)}  # keys [B, K, H, S]
  assert widths == {width for _, width in decode_segments(P, 23, 5)} == {13, 18, 23, 28, 31}

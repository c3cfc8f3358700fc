"""Sampler against transformers' generate, the training path's log-probs, and its own contracts."""
from __future__ import annotations

import jax
import numpy as np
import pytest
import torch
from flax import nnx

from grpo_jax.model import completion_logprobs
from grpo_jax.sampling import Sampler, SamplingConfig
from tests.tolerance import assert_close_f32
from .conftest import jax_twin, random_prompts, teacher_forced_logits, tiny_hf_model

# Compared with float64 / transformers: full float32 matmuls (TF32 by default on NVIDIA GPUs).
pytestmark = pytest.mark.usefixtures("float32_matmuls")

N_NEW = 32


def hf_greedy(hf, prompts, max_new_tokens):
  P = max(map(len, prompts))
  ids = torch.zeros(len(prompts), P, dtype=torch.long)
  attn = torch.zeros_like(ids)
  for i, p in enumerate(prompts):
    ids[i, P - len(p):] = torch.tensor(p)
    attn[i, P - len(p):] = 1
  with torch.inference_mode():
    out = hf.generate(ids, attention_mask=attn, max_new_tokens=max_new_tokens, do_sample=False,
                      pad_token_id=0, eos_token_id=None)
  return out[:, P:].numpy()


@pytest.fixture(scope="module")
def greedy_qwen2(qwen2_pair):
  """Greedy samples for a left-padded batch (prompt lengths 2..13) and the sampler that made them."""
  _, model = qwen2_pair
  graphdef, state = nnx.split(model)
  sampler = Sampler(graphdef, SamplingConfig(max_new_tokens=N_NEW, greedy=True))
  prompts = random_prompts(np.random.default_rng(0), [5, 13, 2, 9, 7, 13], model.cfg.vocab_size)
  return prompts, sampler.generate(state, prompts, jax.random.key(0))


def test_greedy_matches_transformers_generate_qwen2(qwen2_pair, greedy_qwen2):
  hf, _ = qwen2_pair
  prompts, res = greedy_qwen2
  ref = hf_greedy(hf, prompts, N_NEW)
  assert res.completion_BxC.shape == (len(prompts), N_NEW)
  np.testing.assert_array_equal(res.completion_BxC, ref)
  assert res.completion_mask_BxC.all() and res.truncated_B.all()
  np.testing.assert_array_equal(res.lengths_B, N_NEW)
  # Not a degenerate model that repeats one token: the comparison has something to disagree about.
  assert len(np.unique(ref)) > 20


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_greedy_matches_transformers_generate_llama_qwen3(kind, tmp_path):
  """Llama: tied embeddings, llama3 rope scaling. Qwen3: q/k RMSNorm, head_dim 24 != 64 / 4."""
  hf = tiny_hf_model(kind, seed=1)
  model = jax_twin(hf, tmp_path)
  graphdef, state = nnx.split(model)
  # Prompts up to 40 tokens, so positions run past the rope-scaling original_max_position_embeddings=64.
  prompts = random_prompts(np.random.default_rng(1), [40, 3, 17, 26], model.cfg.vocab_size)
  res = Sampler(graphdef, SamplingConfig(max_new_tokens=N_NEW, greedy=True)).generate(
      state, prompts, jax.random.key(0))
  np.testing.assert_array_equal(res.completion_BxC, hf_greedy(hf, prompts, N_NEW))


def test_tiny_temperature_equals_greedy(qwen2_pair, greedy_qwen2):
  _, model = qwen2_pair
  prompts, greedy = greedy_qwen2
  graphdef, state = nnx.split(model)
  res = Sampler(graphdef, SamplingConfig(max_new_tokens=N_NEW, temperature=1e-4)).generate(
      state, prompts, jax.random.key(3))
  np.testing.assert_array_equal(res.completion_BxC, greedy.completion_BxC)


def test_sampled_logprobs_equal_training_path(qwen2_pair):
  """logp_BxC equals completion_logprobs(temperature=T) recomputed by the training path (float32)."""
  _, model = qwen2_pair
  graphdef, state = nnx.split(model)
  T = 0.7
  cfg = SamplingConfig(max_new_tokens=24, temperature=T, stop_ids=(7, 11, 19, 23), pad_id=1)
  prompts = random_prompts(np.random.default_rng(2), [4, 11, 6, 9, 2, 15, 8, 5], model.cfg.vocab_size)
  res = Sampler(graphdef, cfg).generate(state, prompts, jax.random.key(4))
  logp_ref, _ = completion_logprobs(model, res.prompt_BxP, res.prompt_mask_BxP, res.completion_BxC,
                                    res.completion_mask_BxC, temperature=T)
  m = res.completion_mask_BxC.astype(bool)
  max_diff = float(np.max(np.abs(res.logp_BxC - np.asarray(logp_ref))[m]))
  print(f"max |sampler logp - completion_logprobs| at T={T}: {max_diff:.2e} over {m.sum()} tokens")
  # Each float32 side is ~1e-5 from a float64 reference here (|logp| up to ~9), so they may differ by ~2e-5;
  # a real mismatch (wrong temperature, position or mask) gives errors of 1e-2 or more.
  assert max_diff < 2e-5
  assert np.all(res.logp_BxC[~m] == 0.0)
  # The batch mixes stopped and truncated rows, so the masking after stops is exercised too.
  assert 0 < res.truncated_B.sum() < len(prompts), res.truncated_B


def test_stop_ids_end_each_row_and_the_loop(qwen2_pair, greedy_qwen2):
  _, model = qwen2_pair
  prompts, full = greedy_qwen2
  graphdef, state = nnx.split(model)
  # One stop id from each row's greedy completion (row i's at column 2 + i), so every row stops early, some
  # at another row's stop id; rows then stop at their first occurrence of any of them.
  stops = tuple(int(full.completion_BxC[i, 2 + i]) for i in range(len(prompts)))
  pad = 2
  cfg = SamplingConfig(max_new_tokens=N_NEW, greedy=True, stop_ids=stops, pad_id=pad)
  sampler = Sampler(graphdef, cfg, stop_check_every=1)
  res = sampler.generate(state, prompts, jax.random.key(0))
  for i in range(len(prompts)):
    hits = np.flatnonzero(np.isin(full.completion_BxC[i], stops))
    length = hits[0] + 1 if len(hits) else N_NEW
    assert res.lengths_B[i] == length and res.truncated_B[i] == (len(hits) == 0)
    np.testing.assert_array_equal(res.completion_BxC[i, :length], full.completion_BxC[i, :length])
    np.testing.assert_array_equal(res.completion_BxC[i, length:], pad)
    np.testing.assert_array_equal(res.completion_mask_BxC[i], np.arange(N_NEW) < length)
  assert not res.truncated_B.any() and len(set(res.lengths_B)) > 2
  # Decoding stopped once the last row stopped, not after N steps.
  assert sampler.last_num_steps == res.lengths_B.max() < N_NEW
  # Testing for the stop every 4 steps: the same rows, and the loop ends at the first test after the last stop.
  every4 = Sampler(graphdef, cfg, stop_check_every=4)
  res4 = every4.generate(state, prompts, jax.random.key(0))
  for a, b in zip(res, res4):
    np.testing.assert_array_equal(a, b)
  assert every4.last_num_steps == min(1 + 4 * -(-(res.lengths_B.max() - 1) // 4), N_NEW)


def test_top_k_never_leaves_the_top_k(qwen2_pair):
  _, model = qwen2_pair
  graphdef, state = nnx.split(model)
  k = 4
  prompts = random_prompts(np.random.default_rng(5), [3, 8, 12, 5, 9, 6, 10, 4], model.cfg.vocab_size)
  res = Sampler(graphdef, SamplingConfig(max_new_tokens=20, temperature=2.0, top_k=k)).generate(
      state, prompts, jax.random.key(6))
  logits_BxCxV = teacher_forced_logits(model, res)
  kth_BxC = -np.sort(-logits_BxCxV, axis=-1)[..., k - 1]
  chosen_BxC = np.take_along_axis(logits_BxCxV, res.completion_BxC[..., None], axis=-1)[..., 0]
  assert np.all(chosen_BxC >= kth_BxC - 1e-4)
  # At T=2 many draws are not the argmax: the constraint is active, not satisfied by greedy decoding.
  assert np.mean(res.completion_BxC != logits_BxCxV.argmax(-1)) > 0.3


def test_top_p_never_leaves_the_nucleus(qwen2_pair):
  _, model = qwen2_pair
  graphdef, state = nnx.split(model)
  top_p, T = 0.6, 1.5
  prompts = random_prompts(np.random.default_rng(7), [3, 8, 12, 5, 9, 6, 10, 4], model.cfg.vocab_size)
  res = Sampler(graphdef, SamplingConfig(max_new_tokens=20, temperature=T, top_p=top_p)).generate(
      state, prompts, jax.random.key(8))
  logits_BxCxV = teacher_forced_logits(model, res) / T
  probs = np.exp(logits_BxCxV - logits_BxCxV.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  chosen = np.take_along_axis(probs, res.completion_BxC[..., None], axis=-1)
  mass_above_chosen = np.sum(np.where(probs > chosen, probs, 0.0), axis=-1)
  sorted_probs = -np.sort(-probs, axis=-1)
  nucleus_size = np.sum(np.cumsum(sorted_probs, axis=-1) - sorted_probs < top_p, axis=-1)
  assert np.all(mass_above_chosen < top_p + 1e-5)
  # The nucleus is a strict subset and the draws vary inside it.
  assert np.median(nucleus_size) > 2 and np.median(nucleus_size) < model.cfg.vocab_size / 4
  assert np.mean(res.completion_BxC != logits_BxCxV.argmax(-1)) > 0.2


def test_compiles_once_per_bucket(qwen2_pair):
  _, model = qwen2_pair
  graphdef, state = nnx.split(model)
  sampler = Sampler(graphdef, SamplingConfig(max_new_tokens=3, temperature=1.0))
  rng = np.random.default_rng(9)
  # Prompt lengths 1..16 share the 16 bucket; 3 or 4 prompts share the batch bucket 4.
  for i, lengths in enumerate([[3, 16, 1], [1, 5, 7, 2], [16, 2, 9, 4], [11, 12, 13]]):
    res = sampler.generate(state, random_prompts(rng, lengths, model.cfg.vocab_size), jax.random.key(i))
    assert res.prompt_BxP.shape == (len(lengths), 16) and res.completion_BxC.shape == (len(lengths), 3)
  assert sampler.trace_counts == {"prefill": 1, "decode": 1, "prompt_rope": 1}
  assert sampler._prefill._cache_size() == 1 and sampler._decode._cache_size() == 1
  for i, lengths in enumerate([[17, 3, 30], [32, 20, 1, 1]]):
    res = sampler.generate(state, random_prompts(rng, lengths, model.cfg.vocab_size), jax.random.key(9 + i))
    assert res.prompt_BxP.shape == (len(lengths), 32)
  assert sampler.trace_counts == {"prefill": 2, "decode": 2, "prompt_rope": 2}  # one more prompt bucket: 32


def test_generate_rejects_bad_prompts(qwen2_pair):
  _, model = qwen2_pair
  graphdef, state = nnx.split(model)
  sampler = Sampler(graphdef, SamplingConfig(max_new_tokens=2))
  with pytest.raises(ValueError, match="stop_check_every=0"):
    Sampler(graphdef, SamplingConfig(max_new_tokens=2), stop_check_every=0)
  with pytest.raises(ValueError, match="prompt 1 is empty"):
    sampler.generate(state, [[1, 2], []], jax.random.key(0))
  with pytest.raises(ValueError, match=r"prompt 0 has token id 256 outside \[0, vocab_size=256\)"):
    sampler.generate(state, [[1, 256]], jax.random.key(0))
  with pytest.raises(ValueError, match="prompts is empty"):
    sampler.generate(state, [], jax.random.key(0))


def test_groups_share_one_prefill_and_sample_what_repeated_prompts_would(qwen2_pair):
  """generate(prompts, repeats=G) prefills each prompt once and copies its cache to its G rows: the same
  tokens and log-probs as the G-times repeated prompts (equal batch shapes, so equal uniforms), and rows
  r*G .. r*G + G - 1 continue prompt r."""
  _, model = qwen2_pair
  graphdef, state = nnx.split(model)
  sampler = Sampler(graphdef, SamplingConfig(max_new_tokens=12, temperature=1.0))
  prompts = random_prompts(np.random.default_rng(5), [3, 11, 6, 9], model.cfg.vocab_size)
  G = 4
  grouped = sampler.generate(state, prompts, jax.random.key(3), repeats=G)
  repeated = sampler.generate(state, [p for p in prompts for _ in range(G)], jax.random.key(3))
  np.testing.assert_array_equal(grouped.completion_BxC, repeated.completion_BxC)
  np.testing.assert_array_equal(grouped.prompt_BxP, repeated.prompt_BxP)
  np.testing.assert_array_equal(grouped.prompt_mask_BxP, repeated.prompt_mask_BxP)
  assert_close_f32(grouped.logp_BxC, repeated.logp_BxC, ulps=16)  # equal here; 10 ulps the old atol
  # The rows of a group differ (their own uniforms), so the equality above compares real samples.
  assert len({tuple(r) for r in grouped.completion_BxC[:G]}) > 1
  # The prefill's work is that of the 4 distinct prompts: XLA's FLOP count against 16 prompts prefilled.
  def prefill_flops(rows, repeats):
    ids = np.ones((rows, 16), np.int32)
    lowered = sampler._prefill.lower(state, ids, ids, np.ones(16, bool), jax.random.key(0),
                                     sampler._prompt_rope(state, ids), mesh=None, repeats=repeats)
    return lowered.compile().cost_analysis()["flops"]
  assert prefill_flops(4, G) < 0.35 * prefill_flops(16, 1)
  with pytest.raises(ValueError, match="repeats=0"):
    sampler.generate(state, prompts, jax.random.key(3), repeats=0)


def test_prompt_widths_pad_to_the_smallest_that_fits(qwen2_pair):
  _, model = qwen2_pair
  graphdef, state = nnx.split(model)
  sampler = Sampler(graphdef, SamplingConfig(max_new_tokens=2, temperature=1.0), prompt_widths=(8, 24, 40))
  rng = np.random.default_rng(1)
  for lengths, width in [([3, 8], 8), ([9, 2], 24), ([40], 40)]:
    res = sampler.generate(state, random_prompts(rng, lengths, model.cfg.vocab_size), jax.random.key(0))
    assert res.prompt_BxP.shape[1] == width
  with pytest.raises(ValueError, match="41 tokens is longer than the widest prompt width 40"):
    sampler.generate(state, random_prompts(rng, [41], model.cfg.vocab_size), jax.random.key(0))
  with pytest.raises(ValueError, match="ascending"):
    Sampler(graphdef, SamplingConfig(max_new_tokens=2), prompt_widths=(24, 8))


def test_token_steps_run_in_loops_whose_trip_count_xla_knows():
  """The decode's token steps run in inner loops of a static number of steps (XLA:GPU then runs them with no
  host test in between: a loop of unknown trip count copies its condition to the host and waits every
  iteration). 19 token steps with stop_check_every 8: two chunks of 8, then 3, each under an outer loop that
  tests "every row done"; the compiled program's loops that carry the KV cache say so."""
  import re

  from grpo_jax.model import ModelConfig, Transformer
  cfg = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=1, num_heads=4,
                    num_kv_heads=2, head_dim=8, max_position_embeddings=64)
  graphdef, state = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))
  sampler = Sampler(graphdef, SamplingConfig(max_new_tokens=20, temperature=1.0, stop_ids=(1,), pad_id=0))
  decode, compiled = sampler._decode, []

  def keep_program(*args, **kwargs):
    compiled.append(decode.lower(*args, **kwargs).compile().as_text())
    return decode(*args, **kwargs)

  sampler._decode = keep_program
  sampler.generate(state, [[3, 4, 5], [6, 7]], jax.random.key(0))
  cache_loops = [line for line in compiled[0].splitlines()
                 if re.search(r"= \(.*f32\[2,2,8,\d+\].* while\(", line)]  # B 2, K 2, H 8: the keys
  trip_counts = sorted(int(m.group(1)) for line in cache_loops
                       for m in [re.search(r'known_trip_count":\{"n":"(\d+)"', line)] if m)
  assert trip_counts == [3, 8] and len(cache_loops) == 4, cache_loops

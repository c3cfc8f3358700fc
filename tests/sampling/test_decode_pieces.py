"""Keyed rows and decoding in pieces (`Sampler.generate(row_keys=, prefixes=, budget=)`), the sampler side of
rollouts that span updates: a row decoded with a budget per call, its prompt + tokens so far prefilled again at
each next call, gives the tokens of one uninterrupted call, and a row's tokens depend on its key alone."""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from grpo_jax.model import ModelConfig, Transformer
from grpo_jax.sampling import Sampler, SamplingConfig
from tests.tolerance import assert_close_f32

pytestmark = pytest.mark.usefixtures("float32_matmuls")

V, C, G = 97, 20, 2
PROMPTS = [[5 + i for i in range(n)] for n in (4, 1, 11, 6, 3)]  # left padded to 12
BUDGETS = (3, 5, None)  # the pieces: 3 new tokens, then 5, then to the end
X = 42  # the token the second weights make certain (not a stop id)
CONFIGS = {
    # Stop ids that give rows of every kind: stopped in each piece and truncated at C (asserted below).
    "top-k, top-p": SamplingConfig(max_new_tokens=C, stop_ids=(5, 17, 30), temperature=1.3, top_k=9, top_p=0.8),
    # Greedy lengths from the prompts: 3 (stops at the first budget exactly), 1, 12, 11 and 20 (truncated).
    "greedy": SamplingConfig(max_new_tokens=C, stop_ids=(62, 39, 3), greedy=True),
}


def _model():
  cfg = ModelConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                    head_dim=8, max_position_embeddings=128)
  return nnx.split(Transformer(cfg, rngs=nnx.Rngs(params=jax.random.key(3))))


def _certain_weights(state):
  """Weights under which every position's next token is X: every embedding row the same and the layers' outputs
  zero, so the final hidden state is rmsnorm(1) = 1 (up to eps) whatever the context; the head puts logit 100 on
  X and 0 elsewhere."""
  def replace(path, x):
    name = jax.tree_util.keystr(path)
    if "embed_VxD" in name:
      return jnp.ones_like(x)
    if "o_NxHxD" in name or "down_FxD" in name:
      return jnp.zeros_like(x)
    if "lm_head_DxV" in name:
      return jnp.zeros_like(x).at[:, X].set(100.0 / x.shape[0])
    return x
  return jax.tree_util.tree_map_with_path(replace, state)


@functools.cache
def _sampler(sampling: str, slots: int) -> Sampler:
  graphdef, _ = _model()
  return Sampler(graphdef, dataclasses.replace(CONFIGS[sampling], slots=slots), prompt_bucket_min=8,
                 stop_check_every=3)


ROW_KEYS = jax.random.split(jax.random.key(7), len(PROMPTS) * G)
ROW_PROMPTS = [p for p in PROMPTS for _ in range(G)]


def _in_pieces(sampler, states, budgets=BUDGETS):
  """Every row decoded in pieces of `budgets` new tokens, piece i with states[i]: the first piece a fresh group
  call (repeats=G, shared prefill), the next ones only the unfinished rows, each prompt + its tokens so far.
  Returns (tokens, log-probs, [(rows given, SampleResult)] per piece)."""
  first = sampler.generate(states[0], PROMPTS, None, repeats=G, row_keys=ROW_KEYS, budget=budgets[0])
  tokens = [first.completion_BxC[b, :n].tolist() for b, n in enumerate(first.lengths_B)]
  logp = [first.logp_BxC[b, :n].tolist() for b, n in enumerate(first.lengths_B)]
  rows, pieces = np.flatnonzero(first.unfinished_B), [(np.arange(len(ROW_PROMPTS)), first)]
  for state, budget in zip(states[1:], budgets[1:]):
    res = sampler.generate(state, [ROW_PROMPTS[b] for b in rows], None, row_keys=ROW_KEYS[rows],
                           prefixes=[tokens[b] for b in rows], budget=budget)
    for i, b in enumerate(rows):
      start, n = res.start_B[i], res.lengths_B[i]
      assert start == len(tokens[b]) and res.completion_BxC[i, :start].tolist() == tokens[b]
      assert not res.logp_BxC[i, :start].any()
      tokens[b] += res.completion_BxC[i, start:n].tolist()
      logp[b] += res.logp_BxC[i, start:n].tolist()
    pieces.append((rows, res))
    rows = rows[res.unfinished_B]
  assert not len(rows)
  return tokens, logp, pieces


# Two of the four pairings (each sampling mode, each decode), for the suite's time; all four pass.
@pytest.mark.parametrize("sampling, slots", [(list(CONFIGS)[0], 0), (list(CONFIGS)[-1], 4)])
def test_pieces_give_the_one_call_completions(sampling, slots):
  _, state = _model()
  sampler = _sampler(sampling, slots)
  whole = sampler.generate(state, PROMPTS, None, repeats=G, row_keys=ROW_KEYS)
  tokens, logp, pieces = _in_pieces(sampler, [state] * 3)
  lengths = whole.lengths_B
  # Each row's end as its last piece says it: piece, stopped or truncated, as the one call says.
  end_piece, truncated = np.zeros(len(lengths), int), np.zeros(len(lengths), bool)
  for i, (rows, res) in enumerate(pieces):
    end_piece[rows[~res.unfinished_B]] = i
    truncated[rows[~res.unfinished_B]] = res.truncated_B[~res.unfinished_B]
  np.testing.assert_array_equal(truncated, whole.truncated_B)
  # Rows of every kind: stopped in the first piece, in the last, and run to C (sampled: in the second too).
  assert {0, 2} <= set(end_piece[~truncated]) and truncated.any(), (end_piece, truncated)
  assert sampling == "greedy" or 1 in end_piece
  assert [len(t) for t in tokens] == lengths.tolist()
  diff = 0.0
  for b, n in enumerate(lengths):
    assert tokens[b] == whole.completion_BxC[b, :n].tolist(), b  # identical, no near-tie flips with these keys
    diff = max(diff, np.abs(np.array(logp[b]) - whole.logp_BxC[b, :n]).max())
  # The continued rows' contexts are prefilled rather than decoded step by step: measured at most 4.8e-7 in float32
  # (sampled and greedy, static and slots). Tokens are identical here; a near-tie could flip one under other keys.
  assert diff < 5e-6, diff
  print(f"{sampling}, slots={slots}: largest log-prob difference {diff:.2e}")
  assert not whole.unfinished_B.any() and not whole.start_B.any()


def test_second_weights_continue_the_rows():
  """After a first piece of 3 tokens, the unfinished rows continue under weights that make X certain: their first
  tokens are the first weights' one-call tokens, every later one is X (with log-prob 0), up to C."""
  _, state = _model()
  sampler = _sampler("top-k, top-p", 0)
  whole = sampler.generate(state, PROMPTS, None, repeats=G, row_keys=ROW_KEYS)
  tokens, logp, pieces = _in_pieces(sampler, [state, _certain_weights(state)], budgets=(3, None))
  continued = pieces[1][0]
  assert len(continued) >= 5
  for b, n in enumerate(whole.lengths_B):
    first = min(n, 3)
    assert tokens[b][:first] == whole.completion_BxC[b, :first].tolist()
    if b in continued:
      assert tokens[b][3:] == [X] * (C - 3), tokens[b]
      np.testing.assert_allclose(logp[b][3:], 0.0, atol=1e-6)
    else:
      assert len(tokens[b]) == n <= 3


def test_row_keys_make_a_rows_tokens_independent_of_the_batch():
  """A row's tokens follow its key: alone, or in a larger batch in another order, or its group's prefill shared."""
  _, state = _model()
  sampler = _sampler("top-k, top-p", 0)
  grouped = sampler.generate(state, PROMPTS, None, repeats=G, row_keys=ROW_KEYS)
  order = np.random.default_rng(0).permutation(len(ROW_PROMPTS))
  shuffled = sampler.generate(state, [ROW_PROMPTS[b] for b in order], None, row_keys=ROW_KEYS[order])
  alone = [sampler.generate(state, [ROW_PROMPTS[b]], None, row_keys=ROW_KEYS[b:b + 1]) for b in (2, 7)]
  for field in ("completion_BxC", "completion_mask_BxC", "lengths_B", "truncated_B"):
    np.testing.assert_array_equal(getattr(shuffled, field), getattr(grouped, field)[order], err_msg=field)
    for b, res in zip((2, 7), alone):
      np.testing.assert_array_equal(getattr(res, field)[0], getattr(grouped, field)[b], err_msg=field)
  # Other batch shapes, another program: 0.9 ulps of the largest |log-prob| seen, 9 the old atol.
  assert_close_f32(shuffled.logp_BxC, grouped.logp_BxC[order], ulps=16)
  # The call's key is not read, and rows differ from each other (the keys, not the prompt, decide).
  again = sampler.generate(state, PROMPTS, jax.random.key(123), repeats=G, row_keys=ROW_KEYS)
  np.testing.assert_array_equal(again.completion_BxC, grouped.completion_BxC)
  assert any((grouped.completion_BxC[2 * r] != grouped.completion_BxC[2 * r + 1]).any() for r in range(len(PROMPTS)))


def test_keyed_mode_compiles_one_more_prefill_and_decode():
  _, state = _model()
  graphdef, _ = _model()
  sampler = Sampler(graphdef, CONFIGS["greedy"], prompt_bucket_min=8)
  plain = sampler.generate(state, PROMPTS, jax.random.key(0))
  keys = ROW_KEYS[:len(PROMPTS)]
  for budget in (None, 3, 5):  # the budget is an input, not a shape
    keyed = sampler.generate(state, PROMPTS, None, row_keys=keys, budget=budget)
  sampler.generate(state, PROMPTS, None, row_keys=keys, prefixes=[[]] * len(PROMPTS))  # same width
  assert sampler.trace_counts == {"prompt_rope": 1, "prefill": 2, "decode": 2}
  np.testing.assert_array_equal(keyed.completion_BxC[:, :5], plain.completion_BxC[:, :5])  # greedy: keys unused
  assert plain.start_B is None and plain.unfinished_B is None


def test_refusals():
  _, state = _model()
  sampler = _sampler("greedy", 0)
  keys = ROW_KEYS[:2]
  cases = [
      (dict(prefixes=[[1], [2]]), "prefixes and budget need row_keys"),
      (dict(budget=3), "prefixes and budget need row_keys"),
      (dict(row_keys=keys, repeats=2), r"row_keys has shape \(2,\) .* expected one key of the default PRNG per "
                                       r"row: 4 = len\(prompts\) x repeats"),
      (dict(row_keys=ROW_KEYS[:4], repeats=2, prefixes=[[1], [2]] * 2),
       "prefixes cannot be combined with repeats=2"),
      (dict(row_keys=keys, budget=0), "budget=0 must be an int >= 1"),
      (dict(row_keys=keys, prefixes=[[1]]), "1 prefixes for 2 prompts"),
      (dict(row_keys=keys, prefixes=[[1], [2] * C]), "prefix 1 .* nothing to continue"),
      (dict(row_keys=keys, prefixes=[[1, 62], []]), "prefix 0 .* holds a stop id"),
      (dict(row_keys=keys, prefixes=[[1], [V]]), r"prefix 1 has a token id outside \[0, vocab_size=97\)"),
  ]
  for kwargs, match in cases:
    with pytest.raises(ValueError, match=match):
      sampler.generate(state, PROMPTS[:2], None, **kwargs)

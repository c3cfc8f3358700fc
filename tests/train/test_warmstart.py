"""Supervised warm start: the teacher-forcing batch and its loss against a full-softmax reference."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from grpo_jax.data.char_tokenizer import CharTokenizer
from grpo_jax.model import ModelConfig, Transformer
from grpo_jax.train.warmstart import make_sft_step, sft_batch

TOK = CharTokenizer("0123456789+=")


def test_sft_batch_layout():
  prompt, prompt_mask, target, target_mask = sft_batch(TOK, {"prompt": ["1+2=", "10+20="], "answer": ["3", "30"]},
                                                       max_prompt_length=7, max_new_tokens=3)
  np.testing.assert_array_equal(prompt[0], [0, 0, 0, 3, 12, 4, 13])   # left padded
  np.testing.assert_array_equal(prompt_mask[0], [0, 0, 0, 1, 1, 1, 1])
  np.testing.assert_array_equal(target, [[5, 1, 0], [5, 2, 1]])       # answer, stop, right padding
  np.testing.assert_array_equal(target_mask, [[1, 1, 0], [1, 1, 1]])
  with pytest.raises(ValueError, match="max_new_tokens=2"):
    sft_batch(TOK, {"prompt": ["10+20="], "answer": ["30"]}, max_prompt_length=7, max_new_tokens=2)
  with pytest.raises(ValueError, match="max_prompt_length=5"):
    sft_batch(TOK, {"prompt": ["10+20="], "answer": ["30"]}, max_prompt_length=5, max_new_tokens=3)


def test_sft_loss_is_the_answer_tokens_cross_entropy():
  cfg = ModelConfig(vocab_size=TOK.vocab_size, hidden_size=16, intermediate_size=32, num_layers=1, num_heads=2,
                    num_kv_heads=2, head_dim=8, max_position_embeddings=16)
  graphdef, params = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))
  batch = sft_batch(TOK, {"prompt": ["1+2=", "10+20=", "7+7="], "answer": ["3", "30", "14"]}, 7, 3)
  step = make_sft_step(graphdef, optax.sgd(0.0), chunk_size=2)
  _, _, loss = step(jax.tree.map(jnp.array, params), optax.sgd(0.0).init(params), *batch)

  # Reference: each example unpadded (prompt + answer + stop), full softmax over the vocabulary.
  model = nnx.merge(graphdef, params)
  nll, count = 0.0, 0
  for p, pm, t, tm in zip(*batch):
    seq = np.concatenate([p[pm == 1], t[tm == 1]])
    hidden, _ = model(seq[None], jnp.arange(len(seq))[None], jnp.tril(jnp.ones((1, len(seq), len(seq)), bool)))
    logp = jax.nn.log_softmax(model.logits(hidden)[0], axis=-1)
    n_prompt = int(pm.sum())
    for j in range(int(tm.sum())):
      nll -= float(logp[n_prompt - 1 + j, seq[n_prompt + j]])
      count += 1
  np.testing.assert_allclose(float(loss), nll / count, rtol=1e-5)

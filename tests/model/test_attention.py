"""`ModelConfig.attention`: jax.nn.dot_product_attention (XLA here, cuDNN flash attention on NVIDIA GPUs) in
the full-sequence forward gives the log-probs and gradients of grpo_jax's own grouped-query einsums."""
from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

from grpo_jax import config as config_lib
from grpo_jax.train import checks
from tests.tolerance import assert_close_f32
from .test_remat import CFG, _batch, _loss_and_grad

pytestmark = pytest.mark.usefixtures("float32_matmuls")


def _run(cfg, other):
  """((loss, the sum of its terms' magnitudes), grads) of the einsum path `cfg` and of `other`."""
  batch = _batch(B=4, P=7, N=12, seed=3)
  base_fn, params = _loss_and_grad(cfg, cfg, batch)
  other_fn, _ = _loss_and_grad(other, cfg, batch)
  return base_fn(params, *batch), other_fn(params, *batch)


@pytest.mark.parametrize("remat", [False, True])
def test_jax_attention_equals_the_einsum_path(remat):
  """Grouped-query heads (4 query heads on 2 key/value heads), a left-padded prompt, masked completions."""
  cfg = dataclasses.replace(CFG, remat=remat)
  ((loss, terms), grads), ((loss_o, _), grads_o) = _run(cfg, dataclasses.replace(cfg, attention="jax"))
  # Another attention program: the loss within 16 ulps of its terms' magnitudes, each gradient leaf (a sum over
  # every token) within 32 ulps of its largest element.
  assert_close_f32(loss_o, loss, ulps=16, scale=terms)
  assert_close_f32(grads_o, grads, ulps=32)


@pytest.mark.skipif(jax.default_backend() != "gpu", reason="cuDNN flash attention needs an NVIDIA GPU")
def test_cudnn_attention_equals_the_einsum_path_in_bfloat16():
  cfg = dataclasses.replace(CFG, dtype="bfloat16", head_dim=16)
  ((loss, _), grads), ((loss_o, _), grads_o) = _run(cfg, dataclasses.replace(cfg, attention="cudnn"))
  np.testing.assert_allclose(float(loss_o), float(loss), rtol=5e-2, atol=5e-3)
  for (path, g), g_o in zip(jax.tree_util.tree_flatten_with_path(grads)[0], jax.tree.leaves(grads_o)):
    np.testing.assert_allclose(np.asarray(g_o, np.float32), np.asarray(g, np.float32), rtol=5e-2, atol=5e-3,
                               err_msg=jax.tree_util.keystr(path))


def test_cudnn_needs_half_precision_and_unknown_names_fail():
  with pytest.raises(ValueError, match="attention='cudnn' needs dtype bfloat16 or float16"):
    dataclasses.replace(CFG, attention="cudnn")
  with pytest.raises(ValueError, match=r"attention='flash': expected one of \['einsum', 'jax', 'cudnn'\]"):
    dataclasses.replace(CFG, attention="flash")
  c = config_lib.get_config()
  c.model.attention = "cudnn"
  with pytest.raises(ValueError, match="model.attention.*needs model.dtype bfloat16"):
    checks.validate(c)
  c.model.attention = "flash"
  with pytest.raises(ValueError, match="model.attention='flash': not one of"):
    checks.validate(c)

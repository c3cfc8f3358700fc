"""benchmarks/tunix_grpo.py's mapping of a grpo_jax config to Tunix's settings (runs without Tunix)."""
import types

import pytest

from benchmarks import tunix_grpo
from tests.train.conftest import load_experiment


def _config():
  c = load_experiment("smollm2_arithmetic")(None)
  c.grpo.beta = 0.04
  c.grpo.kl_estimator = "k3"
  c.model.remat = False
  return c


def test_spec_counts_prompts_where_grpo_jax_counts_completions():
  c = _config()  # 8 prompts x G 8, micro-batches of 16 completions
  rows = {"prompt": ["What is 1 + 2?"] * 16, "answer": ["3"] * 16}
  spec = tunix_grpo.make_spec(c, rows, steps=2)
  assert (spec["prompts_per_step"], spec["group_size"], spec["micro_prompts"]) == (8, 8, 2)
  assert (spec["max_new_tokens"], spec["max_prompt_length"], spec["temperature"]) == (48, 48, 0.8)
  assert (spec["beta"], spec["epsilon"], spec["kl_loss_mode"]) == (0.04, 0.2, "low_var_kl")
  assert (spec["learning_rate"], spec["grad_clip_norm"], spec["reward"]) == (1e-5, 1.0, "gsm8k_accuracy")
  assert spec["model_dir"].endswith("SmolLM2-135M-Instruct") and spec["rows"] == rows


@pytest.mark.parametrize("key, value, match", [
    ("grpo.micro_batch_size", 12, "not a multiple of G"),
    ("grpo.num_iterations", 2, "one update per step"),
    ("grpo.aggregation", "token_mean", "not mapped"),
    ("grpo.epsilon_high", 0.28, "one clip epsilon"),
    ("model.remat", True, "remat off on every side"),
])
def test_spec_refuses_what_it_cannot_map(key, value, match):
  c = _config()
  section, name = key.split(".")
  setattr(getattr(c, section), name, value)
  with pytest.raises(ValueError, match=match):
    tunix_grpo.make_spec(c, {"prompt": []}, steps=1)


def test_llama_config_keeps_the_checkpoints_rope_theta_and_tied_embeddings():
  fake = types.SimpleNamespace(ModelConfig=lambda **kw: kw)
  hf = {"model_type": "llama", "num_hidden_layers": 30, "vocab_size": 49152, "hidden_size": 576,
        "intermediate_size": 1536, "num_attention_heads": 9, "num_key_value_heads": 3,
        "rope_parameters": {"rope_theta": 100000.0},  # transformers 5's place for it
        "rms_norm_eps": 1e-5, "tie_word_embeddings": True}
  got = tunix_grpo.llama_config(fake, hf)
  assert got == dict(num_layers=30, vocab_size=49152, embed_dim=576, hidden_dim=1536, num_heads=9, head_dim=64,
                     num_kv_heads=3, rope_theta=100000, norm_eps=1e-5, weight_tying=True)
  with pytest.raises(SystemExit, match="model_type 'qwen2'"):
    tunix_grpo.llama_config(fake, {**hf, "model_type": "qwen2"})


def test_snapshot_names_invert_tunixs_loading_map():
  """Tunix loads a Hugging Face Llama by (tunix/models/llama3/params.py): projections transposed and reshaped to
  [D, N, H] (o_proj: [N, H, D]), MLP kernels transposed, norms and embeddings as they are. Built here that way
  from random tensors, `hf_tensors` must give the tensors back, name for name."""
  import numpy as np
  rng = np.random.default_rng(0)
  D, N, K, H, F, V = 8, 4, 2, 2, 12, 10
  hf = {"model.embed_tokens.weight": (V, D), "model.norm.weight": (D,), "lm_head.weight": (V, D)}
  for i in range(2):
    p = f"model.layers.{i}"
    hf.update({f"{p}.self_attn.q_proj.weight": (N * H, D), f"{p}.self_attn.k_proj.weight": (K * H, D),
               f"{p}.self_attn.v_proj.weight": (K * H, D), f"{p}.self_attn.o_proj.weight": (D, N * H),
               f"{p}.mlp.gate_proj.weight": (F, D), f"{p}.mlp.up_proj.weight": (F, D),
               f"{p}.mlp.down_proj.weight": (D, F), f"{p}.input_layernorm.weight": (D,),
               f"{p}.post_attention_layernorm.weight": (D,)})
  hf = {k: rng.normal(size=s) for k, s in hf.items()}
  tunix = {"embedder.input_embedding": hf["model.embed_tokens.weight"], "final_norm.w": hf["model.norm.weight"],
           "lm_head.w": hf["lm_head.weight"].T}
  for i in range(2):
    p, t = f"model.layers.{i}", f"layers.{i}"
    for name, heads in (("q_proj", N), ("k_proj", K), ("v_proj", K)):
      tunix[f"{t}.attn.{name}.w"] = hf[f"{p}.self_attn.{name}.weight"].T.reshape(D, heads, H)
    tunix[f"{t}.attn.o_proj.w"] = hf[f"{p}.self_attn.o_proj.weight"].T.reshape(N, H, D)
    for name in ("gate_proj", "up_proj", "down_proj"):
      tunix[f"{t}.mlp.{name}.kernel"] = hf[f"{p}.mlp.{name}.weight"].T
    for name in ("input_layernorm", "post_attention_layernorm"):
      tunix[f"{t}.{name}.w"] = hf[f"{p}.{name}.weight"]
  back = tunix_grpo.hf_tensors(tunix, {"tie_word_embeddings": False})
  assert sorted(back) == sorted(hf)
  for k in hf:
    np.testing.assert_array_equal(back[k], hf[k], err_msg=k)
  assert "lm_head.weight" not in tunix_grpo.hf_tensors(tunix, {"tie_word_embeddings": True})
  with pytest.raises(KeyError, match="layers.0.attn.rotary"):
    tunix_grpo.hf_tensors({"layers.0.attn.rotary": np.zeros(1)}, {})

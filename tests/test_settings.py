"""The settings tree (grpo_jax/settings.py): the one place of every default, frozen once built, each section
checking itself, and what the settings imply computed from them."""
from __future__ import annotations

import dataclasses

import pytest

from grpo_jax import config as config_lib
from grpo_jax.errors import ConfigError
from grpo_jax.settings import GrpoSettings, OptimSettings, Settings


def test_the_base_config_is_the_settings_defaults():
  settings = Settings.from_config(config_lib.get_config())
  assert settings == Settings()
  assert config_lib.get_config().grpo.to_dict() == dataclasses.asdict(GrpoSettings())


def test_the_tree_is_frozen():
  settings = Settings()
  with pytest.raises(dataclasses.FrozenInstanceError):
    settings.grpo.beta = 0.0  # type: ignore[misc]
  with pytest.raises(dataclasses.FrozenInstanceError):
    settings.num_steps = 1  # type: ignore[misc]


@pytest.mark.parametrize("key, value, message", [
    ("optim.schedule", "linear", "config.optim.schedule='linear': not one of ['constant', 'cosine']"),
    ("grpo.group_size", 1, "config.grpo.group_size=1: must be >= 2 (advantages are relative within a group)"),
    ("sampling.top_p", 0.0, "config.sampling.top_p=0.0: must be in (0, 1]"),
    ("num_steps", 0, "config.num_steps=0: must be >= 1"),
    ("grpo.mini_batch_size", 48, "config.grpo.mini_batch_size=48: does not divide the rollout batch "
     "prompts_per_step * group_size = 32 * 8 = 256"),
])
def test_a_bad_value_is_one_line_naming_key_and_value(key, value, message):
  c = config_lib.get_config()
  section, _, leaf = key.rpartition(".")
  (c[section] if section else c)[leaf] = value
  with pytest.raises(ConfigError) as error:
    Settings.from_config(c)
  assert str(error.value) == message


def test_derived_sizes_by_hand():
  # 6 prompts x G=4 = 24 completions per rollout; mini-batches of 12 (2 per pass), 2 passes: 4 updates a step;
  # micro-batches of 6 rows share a prompt forward for gcd(6, 4) = 2 rows.
  c = config_lib.get_config()
  c.grpo.prompts_per_step, c.grpo.group_size, c.grpo.num_iterations = 6, 4, 2
  c.grpo.mini_batch_size, c.grpo.micro_batch_size = 12, 6
  s = Settings.from_config(c)
  assert (s.rollout_batch_size, s.mini_batch_size, s.micro_batch_size) == (24, 12, 6)
  assert (s.updates_per_step, s.prompt_repeats, s.completion_width) == (4, 2, 4)
  c.model.share_prompt_forward = False
  c.env.name, c.env.max_episode_tokens = "calculator", 20  # an episode is 20 columns wide, not max_new_tokens
  c.reward_funcs, c.reward_weights = ("pkg.mod:brevity",), (0.5,)
  s = Settings.from_config(c)
  assert (s.prompt_repeats, s.completion_width) == (1, 20)
  assert s.configured_rewards == {"exact_match": 1.0, "pkg.mod:brevity": 0.5}
  # 0 means "the next size up": the whole rollout batch, then the whole mini-batch.
  assert Settings(grpo=GrpoSettings(prompts_per_step=3, group_size=2)).micro_batch_size == 6


def test_a_saved_config_with_old_keys_and_missing_sections_builds():
  saved = {"seed": 3, "task": {"holdout_fraction": 0.3, "no_longer_a_key": 1}, "optim": {"learning_rate": 1e-5},
           "reward_funcs": []}  # a config.json: lists for tuples, no env or precision section
  s = Settings.from_config(saved)
  assert (s.seed, s.optim.learning_rate, s.optim.b2, s.env.name, s.reward_funcs) == (3, 1e-5, 0.999, "", ())
  assert s.optim == dataclasses.replace(OptimSettings(), learning_rate=1e-5)


def test_a_fresh_models_config_takes_the_model_sections_shape_fields():
  from grpo_jax.model import ModelConfig
  m = Settings.from_config({"model": {"hidden_size": 96, "num_heads": 6, "num_kv_heads": 2, "remat": True,
                                      "dtype": "bfloat16", "lora_rank": 4}}).model
  cfg = ModelConfig.fresh(m, vocab_size=50)
  assert cfg == ModelConfig(vocab_size=50, hidden_size=96, intermediate_size=256, num_layers=2, num_heads=6,
                            num_kv_heads=2, head_dim=16, max_position_embeddings=32, rope_theta=10000.0,
                            rms_norm_eps=1e-6, tie_word_embeddings=False, param_dtype="float32", dtype="bfloat16",
                            remat=True, attention="einsum")

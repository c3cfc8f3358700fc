"""Decoder-only transformer (Llama / Qwen2 / Qwen3 / Gemma 3) in Flax NNX, with Hugging Face checkpoints in and out."""
from grpo_jax.model.config import LinearRopeScaling, ModelConfig, RopeScaling, from_hf_config, to_hf_config
from grpo_jax.model.transformer import Transformer, LayerCache, init_cache
from grpo_jax.model.logprobs import (causal_attention_mask, positions_from_mask, token_logprobs,
                                     completion_logprobs)

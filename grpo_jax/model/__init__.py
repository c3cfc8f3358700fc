"""Decoder-only transformers in Flax NNX (the families of config.FAMILIES: Llama, Qwen2/3, Qwen3-MoE, gpt-oss, Qwen3.5,
Gemma 3 and 4), with Hugging Face checkpoints in and out."""
from grpo_jax.model.config import LinearRopeScaling, ModelConfig, RopeScaling, from_hf_config, to_hf_config
from grpo_jax.model.transformer import Transformer, LayerCache, init_cache
from grpo_jax.model.logprobs import (causal_attention_mask, positions_from_mask, token_logprobs,
                                     completion_logprobs)

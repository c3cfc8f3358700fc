"""Jit-compiled KV-cache sampler: prefill + lax.while_loop decode, temperature/top-k/top-p/greedy, stop ids."""
from grpo_jax.sampling.config import SamplingConfig
from grpo_jax.sampling.sampler import Sampler, SampleResult
from grpo_jax.sampling.select import select_next_token, nucleus_threshold, sample_inverse_cdf
from grpo_jax.sampling.buckets import bucket_size

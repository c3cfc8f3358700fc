"""`SamplingConfig`: what the sampler draws and when it stops.

Every field is static for compilation: a `Sampler` compiles one prefill and one decode program per
(batch bucket, prompt-length bucket) for its config.
"""
from __future__ import annotations

import dataclasses

from grpo_jax.config_checks import Section
from grpo_jax.settings import check_sampling


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
  """Sampling knobs (HF `generate` semantics, warpers applied in the order temperature, top-k, top-p).

  max_new_tokens: completion width N; generation also stops early once every row has emitted a stop id.
  temperature: logits are divided by it before top-k/top-p and sampling. The returned log-probs are
    log_softmax(logits / temperature) over the full vocabulary, whatever top-k/top-p/greedy truncate:
    the numbers the loss recomputes.
  top_k: keep the k largest logits (0 = off).
  top_p: nucleus sampling, keep the smallest set of most likely tokens whose probability (renormalized after
    top-k) reaches top_p (1.0 = off).
  greedy: argmax instead of sampling (temperature then only affects the returned log-probs).
  stop_ids: a row stops after emitting any of these; the stop token is part of the completion (mask 1).
  pad_id: emitted (mask 0, log-prob 0) after a row stopped, and used to left-pad prompts.
  decode_segment, slots: as a run's `sampling` section has them (grpo_jax/settings.py: SamplingSettings).
  """
  max_new_tokens: int
  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0
  greedy: bool = False
  stop_ids: tuple[int, ...] = ()
  pad_id: int = 0
  decode_segment: int = 0
  slots: int = 0

  def __post_init__(self):
    # Accept any iterable of ints for stop_ids but store a tuple so the config stays hashable.
    object.__setattr__(self, "stop_ids", tuple(int(s) for s in self.stop_ids))
    for name in ("max_new_tokens", "top_k", "pad_id", "decode_segment", "slots"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"SamplingConfig.{name}={value!r}: expected an int")
    check_sampling(Section(self, "SamplingConfig", root=""))  # the ranges, as a run's sampling section has them
    if any(s < 0 for s in self.stop_ids):
      raise ValueError(f"SamplingConfig.stop_ids={self.stop_ids!r}: token ids must be >= 0")
    if self.pad_id < 0:
      raise ValueError(f"SamplingConfig.pad_id={self.pad_id!r}: expected a token id >= 0")

  @classmethod
  def from_config(cls, sampling, **fields) -> "SamplingConfig":
    """From a run's `sampling` section (grpo_jax/settings.py's SamplingSettings, or the ConfigDict it is built
    from: max_new_tokens, temperature, top_k, top_p, decode_segment, slots); `fields` (the tokenizer's stop_ids and
    pad_id, greedy, ...) are set or replaced by the caller."""
    section = {f.name: getattr(sampling, f.name) for f in dataclasses.fields(cls) if hasattr(sampling, f.name)}
    return cls(**{**section, **fields})

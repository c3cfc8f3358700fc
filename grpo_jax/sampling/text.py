"""Text <-> token ids for either tokenizer the project uses: a Hugging Face tokenizer or the synthetic tasks'
`CharTokenizer` (grpo_jax/data/char_tokenizer.py, which takes the same keywords): no special tokens are added on
encoding, and special tokens are skipped on decoding."""
from __future__ import annotations

from typing import Sequence


def encode_text(tokenizer, text: str) -> list[int]:
  """Token ids of `text` (no special tokens added; a prompt's text carries any template)."""
  return list(tokenizer.encode(text, add_special_tokens=False))


def decode_text(tokenizer, ids: Sequence[int]) -> str:
  """The text of `ids`, without a final stop token."""
  ids = [int(t) for t in ids]
  if ids and ids[-1] == tokenizer.eos_token_id:
    ids = ids[:-1]
  return tokenizer.decode(ids, skip_special_tokens=True)

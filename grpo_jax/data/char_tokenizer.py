"""A character-level tokenizer for the synthetic tasks: one id per character, plus padding and a stop token.

Ids: 0 is padding, 1 is the stop (end-of-sequence) token, then the characters in the order given.
It offers the small part of the Hugging Face tokenizer API the training loop uses (`encode`, `decode`,
`pad_token_id`, `eos_token_id`, `vocab_size`), so a synthetic task and a real checkpoint look alike.
"""
from __future__ import annotations

from typing import Iterable, Sequence

PAD_ID = 0
EOS_ID = 1


class CharTokenizer:
  """Maps each character of `chars` to an id >= 2; `decode` stops at the stop token and drops padding."""

  def __init__(self, chars: Iterable[str]):
    chars = list(dict.fromkeys(chars))
    for ch in chars:
      if len(ch) != 1:
        raise ValueError(f"CharTokenizer: {ch!r} is not a single character")
    self.chars = chars
    self._id = {ch: i + 2 for i, ch in enumerate(chars)}
    self.pad_token_id = PAD_ID
    self.eos_token_id = EOS_ID

  @property
  def vocab_size(self) -> int:
    return len(self.chars) + 2

  def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
    """The ids of the characters (no special tokens: `add_special_tokens` is for the Hugging Face signature)."""
    del add_special_tokens
    try:
      return [self._id[ch] for ch in text]
    except KeyError as e:
      raise ValueError(f"CharTokenizer: character {e.args[0]!r} in {text!r} is not in the vocabulary "
                       f"{''.join(self.chars)!r}") from None

  def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
    """The text up to the stop token, padding dropped (`skip_special_tokens`: the Hugging Face signature)."""
    del skip_special_tokens
    out = []
    for i in ids:
      i = int(i)
      if i == EOS_ID:
        break
      if i == PAD_ID:
        continue
      if not 2 <= i < self.vocab_size:
        raise ValueError(f"CharTokenizer: id {i} is outside the vocabulary (size {self.vocab_size})")
      out.append(self.chars[i - 2])
    return "".join(out)

"""grpo_jax: GRPO for language models in JAX, Flax NNX and Optax.

Shape letters. Array names end in their shape (`completion_mask_BxC`, `q_DxNxH`), with these meanings:

  B  rows of a batch: completions (a rollout batch is R x G of them, groups contiguous)
  R  prompts of a rollout          G  completions per prompt (the group)
  P  prompt length (tokens, left padded)      C  completion length (tokens; at most max_new_tokens)
  T  the token axis a function works along: P + C in the model, the completion's C in the losses
  S  KV-cache slots (P + C)
  M  mini-batches per rollout      U  micro-batches per mini-batch     b  rows of a micro-batch
  D  hidden size    F  MLP hidden size    V  vocabulary    L  layers
  N  query heads    K  key/value heads    Q  query heads per key/value head (N = K x Q)
  H  head dimension    Hh  half of it (rotary tables)

A letter stands for one size; `x` joins them (`BxT` is [B, T]); a trailing `_B` names a per-row vector.
The statistics of held-out evaluations (stats/, train/evaluation.py, train/eval_figures.py) count other things with
three of the letters: P prompts, N samples per prompt, S seeds (`correct_PxN`, `scores_SxP`).
"""

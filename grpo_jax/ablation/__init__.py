"""Ablations: sweep specifications (`spec`), a sequential runner with completion markers (`runner`), and the
comparison report (`report`). Nothing here imports JAX: the runner launches `scripts/train.py` as a subprocess."""
from grpo_jax.ablation.spec import Member, axis, grid, variants, validate, load_sweep, default_group

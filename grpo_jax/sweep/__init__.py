"""Sweeps: specifications (`spec`), members run one after another (`runner`) or as Ray tasks (`ray_backend`),
`run_sweep` over either (`launch`, what `grpo-sweep` runs), live progress (`progress`) and the comparison
report (`report`). Nothing here imports JAX: every member's trainer is a subprocess (`grpo_jax.commands.train`);
only asking whether a donor's warm start is committed imports orbax, which starts no JAX backend (train/layout.py)."""
from grpo_jax.sweep.launch import load_members, run_sweep
from grpo_jax.sweep.spec import Member, axis, default_group, grid, load_sweep, validate, variants

"""Training: the GRPO loop and what it is made of, each module in one line in docs/design.md's module map (what a
run keeps on disk: grpo_jax/persist/)."""

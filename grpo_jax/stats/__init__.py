"""Statistics of evaluations and studies: exact per-prompt estimators (avg@N, pass@k, maj@k), their intervals
over prompts, intervals and tests over seeds, and the planning of a study, each module in one line in
docs/design.md's module map. Pure numpy and scipy.stats; no JAX."""

"""Statistics of evaluations and studies: exact per-prompt estimators (avg@N, pass@k, maj@k), their intervals
over prompts, intervals and tests over seeds, and the planning of a study. Pure numpy and scipy.stats; no JAX.

  estimators.py   avg@N, pass@k (Chen et al. 2021), maj@k over all k-subsets, per prompt
  intervals.py    95% intervals over prompts (Wilson, BCa bootstrap) and over seeds (Student's t)
  comparisons.py  paired differences (t, p, Holm), probability of improvement, the two-level bootstrap
  power.py        the smallest effect n seeds detect, the seeds an effect needs, the prompts a width needs
"""

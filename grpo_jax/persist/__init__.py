"""Persistence: what a run keeps on disk or a store, apart from the GRPO pipeline (grpo_jax/train/).

  layout.py       the files of a workdir, named once, and which checkpoints are committed (no JAX)
  workdir.py      `Workdir`, the one writer of a run's workdir: config.json, run id, starting point, summary.json
  checkpoint.py   orbax checkpoints with fallback past a damaged one
  fingerprint.py  a state's fingerprint, computed where its arrays live
  metrics.py      metrics.jsonl, samples.jsonl, TensorBoard, the progress bar
  workdir_lock.py one run per workdir: a file lock locally, the lease on a store
  lease.py        one run per workdir on an object store (a lease taken with a conditional write)
  preemption.py   SIGTERM / SIGINT / a cloud's notice: stop at the next safe point, a deadline
"""

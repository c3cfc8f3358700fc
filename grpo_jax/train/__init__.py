"""Training: the GRPO loop and what it is made of.

  step.py        the jitted update (mu passes x mini-batches x micro-batch gradient accumulation) and log-probs
  rollout.py     prompts -> sampler -> rewards -> advantages -> a RolloutBatch
  policy.py      what is trained: full fine-tuning, or LoRA adapters on a frozen base
  offload.py     reference parameters parked in host memory between uses
  evaluation.py  held-out greedy accuracy, avg@N, pass@k, maj@k with intervals, per-prompt rows
  eval_figures.py the evaluation figures, each registered once: name, estimator, interval, config key
  warmstart.py   supervised warm start (teacher-forced cross-entropy)
  optim.py       AdamW + warmup/cosine schedule + global-norm clipping
  state.py       optimizer state placed like the parameters
  checkpoint.py  orbax checkpoints with fallback past a damaged one
  fingerprint.py a state's fingerprint, computed where its arrays live
  export.py      the policy as a Hugging Face model directory
  metrics.py     metrics.jsonl, samples.jsonl, TensorBoard, the progress bar
  plotting.py    training curves of one or more runs
  timing.py      where a run's wall-clock goes (summary.json's time_split_s)
  checks.py      `validate(config)`: the settings tree, built once and self-checked, then what only owners check
  build.py       a run's parts from its config: task, tokenizer, model, rewards, samplers
  inputs.py      what a notebook hands a run besides its config: reward callables, datasets, callbacks
  run.py         a run's parts built once, its state, and a step's phases: rollout, update, evaluate
  distributed.py multi-host runs: one process per host, collectives at the loop's decision points
  preemption.py  SIGTERM / SIGINT / a cloud's notice: stop at the next safe point, a deadline
  lease.py       one run per workdir on an object store (a lease taken with a conditional write)
  workdir_lock.py one run per workdir: a file lock locally, the lease on a store
  layout.py      the files of a workdir, named once, and which checkpoints are committed (no JAX)
  workdir.py     `Workdir`, the one writer of a run's workdir: config.json, run id, starting point, summary.json
  hooks.py       what happens after a step: evaluate, log, callbacks, checkpoint, stop on divergence
  loop.py        `train(config, workdir)`: init or restore, then rollout -> update -> the after-step hooks
"""

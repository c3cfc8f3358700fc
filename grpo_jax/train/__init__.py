"""Training: the GRPO loop and what it is made of.

  step.py        the jitted update (mu passes x mini-batches x micro-batch gradient accumulation) and log-probs
  rollout.py     prompts -> sampler -> rewards -> advantages -> a RolloutBatch
  evaluation.py  held-out greedy accuracy, mean reward, pass@k
  warmstart.py   supervised warm start (teacher-forced cross-entropy)
  optim.py       AdamW + warmup/cosine schedule + global-norm clipping
  state.py       optimizer state placed like the parameters
  checkpoint.py  orbax checkpoints with fallback past a damaged one
  metrics.py     metrics.jsonl, samples.jsonl, TensorBoard, the progress bar
  plotting.py    training curves of one or more runs
  checks.py      `validate(config)`: the settings tree, built once and self-checked, then what only owners check
  build.py       a run's parts from its config: task, tokenizer, model, rewards, samplers
  workdir.py     config.json, run id, lock, resume checks, summary.json
  loop.py        `train(config, workdir)`: init or restore, then rollout -> update -> log/checkpoint per step
"""

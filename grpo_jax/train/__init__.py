"""Training: the GRPO loop and what it is made of (what a run keeps on disk: grpo_jax/persist/).

  step.py        the jitted update (mu passes x mini-batches x micro-batch gradient accumulation) and log-probs
  rollout.py     prompts -> sampler -> rewards -> advantages -> a RolloutBatch
  policy.py      what is trained: full fine-tuning, or LoRA adapters on a frozen base
  offload.py     reference parameters parked in host memory between uses
  evaluation.py  held-out greedy accuracy, avg@N, pass@k, maj@k with intervals, per-prompt rows
  eval_figures.py the evaluation figures, each registered once: name, estimator, interval, config key
  warmstart.py   supervised warm start (teacher-forced cross-entropy)
  optim.py       AdamW + warmup/cosine schedule + global-norm clipping
  state.py       optimizer state placed like the parameters
  export.py      the policy as a Hugging Face model directory
  plotting.py    training curves of one or more runs
  timing.py      where a run's wall-clock goes (summary.json's time_split_s)
  checks.py      `validate(config)`: the settings tree, built once and self-checked, then what only owners check
  build.py       a run's parts from its config: task, tokenizer, model, rewards, samplers
  inputs.py      what a notebook hands a run besides its config: reward callables, datasets, callbacks
  run.py         a run's parts built once, its state; a batch prepared, an update
  producer.py    the batches: sampled inline or on the sampler's own devices during the update
  distributed.py multi-host runs: one process per host, collectives at the loop's decision points
  hooks.py       what happens after a step: evaluate, log, callbacks, checkpoint, stop on divergence
  loop.py        `train(config, workdir)`: init or restore, then rollout -> update -> the after-step hooks
"""

#!/usr/bin/env python
"""Learning per wall-clock: TRL's GRPOTrainer on the same model, task, reward and settings as a grpo_jax run.

  .venv/bin/pip install "trl==1.16.0" -c constraints.txt          # once; TRL is not a dependency
  .venv/bin/python benchmarks/trl_learning.py --out runs/trl_smollm2_s0 --steps 20
  .venv/bin/python scripts/train.py --config experiments/smollm2_arithmetic.py --workdir runs/smollm2_s0 \
      --config.num_steps=20
  .venv/bin/python benchmarks/trl_learning.py --plot runs/smollm2_s0 runs/trl_smollm2_s0 \
      --figure docs/figures/trl_vs_grpo_jax.png

The settings come from the grpo_jax experiment file (`--config`, default experiments/smollm2_arithmetic.py),
mapped to TRL's names: G -> num_generations; prompts_per_step x G completions per optimizer update as
per_device_train_batch_size = micro_batch_size with gradient_accumulation_steps = the number of
micro-batches (so one generation batch feeds exactly one update, as in grpo_jax); max_new_tokens ->
max_completion_length; temperature; beta; epsilon_low / epsilon_high -> epsilon / epsilon_high; the aggregation "seq_mean_token_mean" ->
loss_type "grpo"; std-scaled group advantages -> scale_rewards "group"; AdamW lr, betas, eps, weight decay,
clip norm, constant schedule; gradient checkpointing as `model.remat` (TRL's GRPOConfig turns it on by
default, which would recompute every layer in the backward pass); float32 on the CPU. Prompts are TRL's conversational form (one user message), which TRL renders
with the model's chat template; the text equals grpo_jax's "chat" template (checked at start-up). The reward
is grpo_jax's own `gsm8k_accuracy`.

Wall-clock counts training only, as grpo_jax's `step_time` does: from the start of the first step to the end
of each step, minus the time spent saving evaluation snapshots. Every `--eval-every` steps the policy is saved
as a Hugging Face directory; after training each snapshot is evaluated greedily by grpo_jax's evaluator on the
run's held-out prompts (the same evaluator, prompts and max_new_tokens as the grpo_jax run's `eval/accuracy`),
so both curves are measured the same way. OUT/metrics.jsonl holds {step, wall_s, eval/accuracy, ...}.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_experiment(path: str, preset: str | None = None):
  spec = importlib.util.spec_from_file_location("experiment", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(preset)


def trl_arguments(config, out: str, steps: int) -> dict:
  """GRPOConfig keyword arguments equivalent to the grpo_jax config (module docstring)."""
  g, o, s = config.grpo, config.optim, config.sampling
  completions = g.prompts_per_step * g.group_size
  micro = g.micro_batch_size or completions
  if completions % micro:
    raise ValueError(f"micro_batch_size {micro} does not divide {completions} completions per step")
  if g.num_iterations != 1 or g.mini_batch_size not in (0, completions):
    raise ValueError("only one update per step (num_iterations 1, one mini-batch) is mapped to TRL")
  loss_types = {"seq_mean_token_mean": "grpo", "token_mean": "dapo", "seq_mean_token_sum_norm": "dr_grpo"}
  if g.aggregation not in loss_types or o.schedule != "constant" or o.warmup_steps:
    raise ValueError("aggregation / schedule not mapped to TRL here")
  return dict(
      output_dir=out, max_steps=steps, seed=config.seed, use_cpu=True, bf16=False,
      num_generations=g.group_size, per_device_train_batch_size=micro,
      gradient_accumulation_steps=completions // micro, steps_per_generation=completions // micro,
      max_completion_length=s.max_new_tokens, temperature=s.temperature, top_p=1.0, top_k=0,
      beta=g.beta, epsilon=g.epsilon_low, epsilon_high=g.epsilon_high or g.epsilon_low, loss_type=loss_types[g.aggregation],
      scale_rewards="group" if g.advantage == "grpo" else "none", num_iterations=1,
      learning_rate=o.learning_rate, lr_scheduler_type="constant", warmup_steps=0,
      adam_beta1=o.b1, adam_beta2=o.b2, adam_epsilon=o.eps, weight_decay=o.weight_decay,
      max_grad_norm=o.grad_clip_norm, logging_steps=1, report_to="none", save_strategy="no",
      disable_tqdm=True, dataloader_num_workers=0, gradient_checkpointing=config.model.remat)


def logs_by_step(trainer) -> dict[int, dict]:
  """TRL's log records by step: the step's log and, at the last step, the end-of-training summary, merged."""
  logs: dict[int, dict] = {}
  for h in trainer.state.log_history:
    if "step" in h:
      logs.setdefault(h["step"], {}).update(h)
  return logs


def train_trl(args) -> None:
  import torch
  from datasets import Dataset
  from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
  from trl import GRPOConfig, GRPOTrainer

  from grpo_jax.data import templates, word_arithmetic
  from grpo_jax.rewards.registry import get_reward
  from grpo_jax.train.timing import seconds_since_launch

  config = load_experiment(args.config)
  config.seed = args.seed
  model_dir = config.model.hf_path
  tokenizer = AutoTokenizer.from_pretrained(model_dir)
  train_rows, _ = word_arithmetic.split(config.task.num_digits, config.task.heldout_fraction)
  conversation = [{"role": "user", "content": train_rows[0]["prompt"]}]
  ours = templates.render_prompt(train_rows[0]["prompt"], "chat", tokenizer, config.task.system_prompt or None)
  theirs = tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)
  if ours != theirs:
    raise RuntimeError(f"prompt texts differ:\n{ours!r}\n{theirs!r}")
  dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": r["prompt"]}], "answer": r["answer"]}
                               for r in train_rows])
  accuracy = get_reward(config.eval.accuracy_reward)

  def gsm8k_accuracy(prompts, completions, answer, **_):
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [float(x) for x in accuracy(list(prompts), texts, answer=list(answer))]

  os.makedirs(args.out, exist_ok=True)
  torch.manual_seed(args.seed)
  model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
  snapshots = os.path.join(args.out, "snapshots")
  records = []

  class Clock(TrainerCallback):
    """Training wall-clock per step; snapshot saving is paused out of it."""

    def __init__(self):
      self.start, self.paused = None, 0.0

    def on_step_begin(self, a, state, control, **kw):
      if self.start is None:
        self.start = time.time()

    def on_step_end(self, a, state, control, **kw):
      wall = time.time() - self.start - self.paused
      launch = seconds_since_launch()
      records.append({"step": state.global_step, "wall_s": wall,
                      "since_launch_s": None if launch is None else launch - self.paused})
      print(f"step {state.global_step}: {wall:.1f} s", flush=True)
      if state.global_step % args.eval_every == 0 or state.global_step == args.steps:
        t0 = time.time()
        kw["model"].save_pretrained(os.path.join(snapshots, str(state.global_step)))
        self.paused += time.time() - t0

  trainer = GRPOTrainer(model=model, reward_funcs=[gsm8k_accuracy], train_dataset=dataset,
                        processing_class=tokenizer, callbacks=[Clock()],
                        args=GRPOConfig(**trl_arguments(config, args.out, args.steps)))
  trainer.train()
  logs = logs_by_step(trainer)
  for r in records:
    r.update({f"trl/{k}": v for k, v in logs.get(r["step"], {}).items() if isinstance(v, (int, float))})
  with open(os.path.join(args.out, "train_log.jsonl"), "w") as f:
    for r in records:
      f.write(json.dumps(r) + "\n")
  evaluate_snapshots(args.out, config, {r["step"]: r for r in records}, args.keep_snapshots)


def evaluate_snapshots(out_dir: str, config, clock_by_step: dict, keep: bool = False) -> None:
  """grpo_jax's greedy evaluator on the base model (step 0) and on every snapshot in OUT_DIR/snapshots/STEP;
  OUT_DIR/metrics.jsonl gets a record per step: its clock_by_step fields (wall_s...) and the eval/* metrics."""
  import jax

  from grpo_jax.model import hf_io
  from grpo_jax.model import sharding as sharding_lib
  from grpo_jax.train import build
  from grpo_jax.train.evaluation import evaluate
  from grpo_jax.train.rollout import scoring_of
  from flax import nnx
  from grpo_jax.settings import Settings

  config = Settings.from_config(config)
  tokenizer, task = build.build_tokenizer_and_task(config)
  mesh = sharding_lib.make_mesh(data=config.mesh.data, fsdp=config.mesh.fsdp, tensor=config.mesh.tensor)
  graphdef, _ = build.build_model(config, tokenizer, mesh)
  _, greedy, _ = build.make_samplers(graphdef, config, tokenizer)
  columns = task.eval_rows(config.eval.size)
  snapshots = os.path.join(out_dir, "snapshots")
  steps = sorted(int(d) for d in os.listdir(snapshots))
  out = []
  for step in [0] + steps:
    path = config.model.hf_path if step == 0 else os.path.join(snapshots, str(step))
    model = hf_io.from_pretrained(path, dtype=config.model.dtype, param_dtype=config.model.param_dtype)
    _, params = nnx.split(model)
    metrics = evaluate(greedy, params, tokenizer, columns, scoring_of(config, build.build_reward_fns(config)),
                       accuracy_reward=config.eval.accuracy_reward,
                       batch_size=min(config.eval.batch_size, len(columns["prompt"])),
                       max_prompt_length=config.sampling.max_prompt_length, key=jax.random.key(0))
    clock = {k: v for k, v in clock_by_step.get(step, {}).items() if k != "step"}
    record = {"step": step, "wall_s": 0.0, **clock, **metrics}
    print(json.dumps(record), flush=True)
    out.append(record)
  with open(os.path.join(out_dir, "metrics.jsonl"), "w") as f:
    for r in out:
      f.write(json.dumps(r) + "\n")
  if not keep:
    shutil.rmtree(snapshots)


def curve(workdir: str) -> tuple[list[float], list[float]]:
  """(training wall-clock seconds, held-out accuracy) at each evaluation of a grpo_jax or a TRL run."""
  from grpo_jax.persist.metrics import read_jsonl
  rows = read_jsonl(os.path.join(workdir, "metrics.jsonl"))
  if any("wall_s" in r for r in rows):          # this script's TRL record
    pts = [(r["wall_s"], r["eval/accuracy"]) for r in rows if "eval/accuracy" in r]
  else:                                          # grpo_jax: cumulative step_time; step 0's eval at 0 s
    clock, pts = 0.0, []
    for r in rows:
      clock += r.get("step_time", 0.0)
      if "eval/accuracy" in r:
        pts.append((clock, r["eval/accuracy"]))
  return [p[0] for p in pts], [p[1] for p in pts]


def draw(series, xlabel: str, title: str, figure: str, hline=None) -> None:
  """Held-out accuracy curves [(label, minutes, accuracy %)] in one figure; `hline`: (y %, label) or None."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(6.4, 4.0))
  for label, x, y in series:
    ax.plot(x, y, marker="o", label=label)
  if hline:
    ax.axhline(hline[0], color="gray", linestyle="--", linewidth=1, label=hline[1])
  ax.set_xlabel(xlabel)
  ax.set_ylabel("held-out greedy accuracy (%)")
  ax.set_title(title)
  ax.grid(alpha=0.3)
  ax.legend()
  fig.tight_layout()
  fig.savefig(figure, dpi=120)
  print(f"wrote {figure}")


def plot(args) -> None:
  series = []
  for workdir, label in zip(args.plot, args.labels.split(",")):
    x, y = curve(workdir)
    series.append((label, [t / 60 for t in x], [100 * a for a in y]))
    print(f"{label}: " + ", ".join(f"{t / 60:.1f} min {100 * a:.1f}%" for t, a in zip(x, y)))
  draw(series, "training wall-clock (minutes, 2-core CPU)", args.title, args.figure)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--config", default=os.path.join(ROOT, "experiments", "smollm2_arithmetic.py"))
  parser.add_argument("--out", default="runs/trl_smollm2")
  parser.add_argument("--steps", type=int, default=20)
  parser.add_argument("--eval-every", type=int, default=5)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--keep-snapshots", action="store_true")
  parser.add_argument("--evaluate-only", action="store_true",
                      help="evaluate the snapshots of an earlier --keep-snapshots run in --out (train_log.jsonl)")
  parser.add_argument("--plot", nargs="+", default=None, help="workdirs to draw (grpo_jax and TRL runs)")
  parser.add_argument("--labels", default="grpo_jax,TRL GRPOTrainer")
  parser.add_argument("--title", default="SmolLM2-135M-Instruct, sums in English (seed 0)")
  parser.add_argument("--figure", default="docs/figures/trl_vs_grpo_jax.png")
  args = parser.parse_args(argv)
  if args.plot:
    plot(args)
  elif args.evaluate_only:
    config = load_experiment(args.config)
    config.seed = args.seed
    from grpo_jax.persist.metrics import read_jsonl
    records = read_jsonl(os.path.join(args.out, "train_log.jsonl"))
    evaluate_snapshots(args.out, config, {r["step"]: r for r in records}, args.keep_snapshots)
  else:
    train_trl(args)


if __name__ == "__main__":
  main()

"""`grpo-evaluate`: evaluates a run's checkpoint (or its starting model) greedily on its held-out or transfer
prompts, and can write the checkpoint out as a Hugging Face model.

  grpo-evaluate runs/smollm2_s0                    # the latest checkpoint, held-out prompts
  grpo-evaluate runs/smollm2_s0 --base             # the model the run started from (hf_path)
  grpo-evaluate runs/smollm2_s0 --set three_digit  # a transfer set of the run's task
  grpo-evaluate runs/smollm2_s0 --export out/policy   # and write it out (as grpo-export)
  grpo-evaluate --config experiments/gym.py:syllogism --size 50   # an experiment's starting model

Besides accuracy it splits the completions into: finished (a stop token within max_new_tokens) or cut off, and
correct or not, so a gain can be read as format / brevity (fewer cut off) or arithmetic (more finished ones
right). `--samples N` adds N completions per prompt at `--temperature`: avg@N (their mean accuracy), pass@k for
each k of `--pass_k 1,4,16` (Chen et al.'s unbiased estimator: the chance that k samples hold a right answer,
the headroom a short run can sharpen greedy accuracy towards) and maj@k for each k of `--maj_k 4,16` (majority
vote over all k-subsets of the N, ties split evenly), as grpo_jax/train/eval_figures.py registers them (a
figure's config.eval key is its option). Every figure has its 95% interval over prompts and the
method's name; `--out FILE.jsonl` writes one row per prompt (each sample's answer, reward and correctness) from
which all of them can be recomputed. The run's own config (WORKDIR/config.json) gives the task, model, prompts
and lengths.

  grpo-evaluate runs/smollm2_s0 --samples 16 --pass_k 1,4,16 --maj_k 4,16 --out runs/smollm2_s0/eval16.jsonl
"""
from __future__ import annotations

import argparse
import sys
import time

import jax

from grpo_jax import compile_cache, errors, hash_seed
from grpo_jax.commands import command_parser, exit_on_mistake
from grpo_jax.data import tasks
from grpo_jax.settings import Settings
from grpo_jax.sweep.spec import load_module
from grpo_jax.train import build, checks, eval_figures
from grpo_jax.train.evaluation import evaluate, write_rows
from grpo_jax.train.export import load_run_config, restore_run_params, write_hf_model
from grpo_jax.train.producer import make_meshes
from grpo_jax.train.rollout import scoring_of


def run(argv=None) -> None:
  """Evaluates as the command line `argv` says (what `grpo-evaluate` runs, after pinning the hash seed)."""
  parser = command_parser("grpo-evaluate", __doc__)
  parser.add_argument("workdir", nargs="?", default=None, help="a run's directory (or give --config)")
  parser.add_argument("--config", default=None,
                      help="FILE.py[:PRESET]: evaluate that experiment's starting model, without a run (implies --base)")
  parser.add_argument("--step", type=int, default=None, help="checkpoint step (default: the latest)")
  parser.add_argument("--base", action="store_true", help="evaluate the starting model (model.hf_path)")
  parser.add_argument("--set", default="heldout", help="'heldout' or a transfer set of the task")
  parser.add_argument("--size", type=int, default=None, help="prompts (default: the run's eval.size)")
  parser.add_argument("--examples", type=int, default=4, help="completions to print")
  parser.add_argument("--samples", type=int, default=None,
                      help="N completions per prompt at --temperature (default: the largest k asked for, else 0)")
  for f in (f for f in eval_figures.figures() if f.ks):
    parser.add_argument(f"--{f.ks}", type=_ks, default=(), help=f"{f.name.split('<')[0]}k for each k, "
                        "comma-separated (k <= N)")
  parser.add_argument("--temperature", type=float, default=None,
                      help="the samples' temperature (default: the run's sampling.temperature)")
  parser.add_argument("--out", default=None, help="FILE.jsonl: one row per prompt with every sample's answer, "
                      "reward and correctness")
  parser.add_argument("--export", default=None, help="write the parameters as a Hugging Face model here")
  args = parser.parse_args(argv)
  if (args.workdir is None) == (args.config is None):
    parser.error("give a run's workdir or --config FILE.py[:PRESET], not both")
  if args.config:
    preset = args.config.partition(":")[2]
    config = load_module(args.config).get_config(preset or None)
    args.base, args.workdir = True, args.config
  else:
    config = load_run_config(args.workdir)  # checked when the run started
  ks = {key: getattr(args, key) for key in eval_figures.asked(config.eval)}
  with config.eval.ignore_type():
    config.eval.samples = max((k for v in ks.values() for k in v), default=0) if args.samples is None else args.samples
    config.eval.update(ks)
  config.eval.temperature = config.sampling.temperature if args.temperature is None else args.temperature
  settings = checks.validate(config) if args.config else Settings.from_config(config)  # eval.* checked here
  size = args.size or settings.eval.size
  tokenizer, task = build.build_tokenizer_and_task(settings)
  sets = ("heldout", *getattr(task, "transfer_sets", ()))
  if args.set not in sets:  # before the model is loaded
    raise errors.UserError(f"--set {args.set!r}: the run's task ({settings.task.name}) has no such set; its sets: "
                           f"{', '.join(sets)} (transfer sets come from config.task.transfer)")
  mesh = make_meshes(settings)[0]  # the trainer's, as the run laid out its parameters
  t0 = time.perf_counter()
  print(f"[model] {'loading ' + settings.model.hf_path if settings.model.hf_path else 'initializing the model'} ...",
        file=sys.stderr, flush=True)
  graphdef, params = build.build_model(settings, tokenizer, mesh)
  source = "base model"
  if not args.base:
    params, step = restore_run_params(args.workdir, params, args.step)
    source = f"checkpoint {step}"
  print(f"[model] the {source} in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
  columns = task.eval_rows(size) if args.set == "heldout" else task.transfer_rows(args.set, size)
  _, greedy, sampler = build.make_samplers(graphdef, settings, tokenizer)
  batch_size = min(settings.eval.batch_size, len(columns["prompt"]))
  print(f"[eval] {len(columns['prompt'])} prompts of {args.set}, {batch_size} per sampler call (the first "
        "compiles the sampler) ...", file=sys.stderr, flush=True)
  t0 = time.perf_counter()
  with compile_cache.CompileCounter() as compiled:
    metrics, details = evaluate(
        greedy, params, tokenizer, columns, scoring_of(settings, build.build_reward_fns(settings)),
        accuracy_reward=settings.eval.accuracy_reward, batch_size=batch_size,
        max_prompt_length=settings.sampling.max_prompt_length, key=jax.random.key(0), return_details=True,
        samples=settings.eval.samples, ks=eval_figures.asked(settings.eval), sampler=sampler,
        sample_completions=True, on_batch=batch_lines())
  print(f"[eval] done in {time.perf_counter() - t0:.1f} s ({compiled.describe()})", file=sys.stderr, flush=True)
  constant = tasks.constant_answer(settings, columns)
  completions = details["completions"]
  correct, finished = details["accuracy"] >= 1.0, details["finished"]
  n = len(completions)
  print(f"{args.workdir} ({source}), {args.set}, {n} prompts: accuracy {metrics['eval/accuracy']:.3f}, full "
        f"credit {metrics['eval/full_credit']:.3f}, "
        f"mean length {metrics['eval/mean_length']:.1f} tokens"
        + (f"; the one constant answer {constant[0]!r} would score {constant[1]:.3f}" if constant else ""))
  print(f"  finished {finished.mean():.3f} (correct among them {correct[finished].mean() if finished.any() else 0:.3f})"
        f", cut off at max_new_tokens {1 - finished.mean():.3f} (correct among them "
        f"{correct[~finished].mean() if (~finished).any() else 0:.3f})")
  print(figure_lines(metrics, details["methods"], settings.eval.samples, settings.eval.temperature))
  if args.out:
    write_rows(args.out, details["rows"])
    print(f"  wrote {n} rows to {args.out}")
  for i in range(min(args.examples, n)):
    question = columns.get("prompt")[i]
    print(f"  [{'right' if correct[i] else 'wrong'}] ...{question[-40:]!r} -> {completions[i]!r}")
  if args.export:
    write_hf_model(graphdef, params, settings.model.hf_path, tokenizer, args.export)


def _ks(text: str) -> tuple[int, ...]:
  """'1,4,16' -> (1, 4, 16)."""
  try:
    ks = tuple(int(k) for k in text.split(",") if k.strip())
  except ValueError:
    ks = ()
  if not ks or min(ks) < 1:
    raise argparse.ArgumentTypeError(f"{text!r}: give positive integers separated by commas, e.g. 1,4,16")
  return ks


def figure_lines(metrics: dict, methods: dict, samples: int, temperature: float) -> str:
  """Each figure (`methods`' keys, in the order evaluate computed them) with its 95% interval and the interval's
  method, one per line."""
  lines = ["  95% intervals over prompts (wilson: Wilson's score interval, for a 0/1 score per prompt; bca: a BCa "
           "bootstrap over prompts, a prompt's samples kept together):"]
  for name in methods:
    where = "greedy" if eval_figures.figure_of(name).greedy else f"{samples} samples at T {temperature:g}"
    lines.append(f"    {name.split('/', 1)[1]:<12} {metrics[name]:.3f}  [{metrics[name + '/lo']:.3f}, "
                 f"{metrics[name + '/hi']:.3f}]  {methods[name]}, {where}")
  return "\n".join(lines)


def batch_lines(every_s: float = 10.0, stream=None):
  """`on_batch(done, total)` for `evaluate`: a line after the first sampler call and then at most every
  `every_s` seconds, with the time left at the pace of the calls after the first (which compiles)."""
  start, last = time.perf_counter(), [None, None]  # (end of the first call, time of the last line)

  def on_batch(done: int, total: int) -> None:
    now = time.perf_counter()
    if done == 1:
      last[0] = last[1] = now
      print(f"[eval] sampler call 1/{total} (compiling) took {now - start:.1f} s", file=stream or sys.stderr,
            flush=True)
    elif now - last[1] >= every_s or done == total:
      last[1] = now
      left = (now - last[0]) / (done - 1) * (total - done)
      print(f"[eval] sampler call {done}/{total}" + (f", ~{left:.0f} s left" if done < total else ""),
            file=stream or sys.stderr, flush=True)
  return on_batch


def main() -> None:
  """The `grpo-evaluate` command."""
  hash_seed.pin()  # the same held-out items as the run (grpo_jax/hash_seed.py)
  exit_on_mistake("grpo-evaluate", run)


if __name__ == "__main__":
  main()

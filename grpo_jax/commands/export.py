"""`grpo-export`: writes a run's policy as a Hugging Face model directory that transformers loads.

  grpo-export runs/gsm8k out/gsm8k_policy            # the latest checkpoint
  grpo-export runs/gsm8k out/gsm8k_step100 --step 100

The directory: config.json, safetensors (the run's parameter dtype), the tokenizer and chat template of the
run's `model.hf_path`, and generation_config.json whose eos_token_id lists the tokens the run's sampler stopped
at (grpo_jax/train/export.py). `--config.checkpoint.export_hf=True` does the same at the end of a run, into
WORKDIR/hf_model.
"""
from __future__ import annotations

from grpo_jax.commands import command_parser, exit_on_mistake
from grpo_jax.settings import Settings
from grpo_jax.train import build
from grpo_jax.train.export import load_run_config, restore_run_params, write_hf_model
from grpo_jax.train.producer import make_meshes


def main(argv=None) -> None:
  """The `grpo-export` command."""
  exit_on_mistake("grpo-export", lambda: run(argv))


def run(argv=None) -> None:
  parser = command_parser("grpo-export", __doc__)
  parser.add_argument("workdir", help="a training run's workdir")
  parser.add_argument("out", help="the directory to write")
  parser.add_argument("--step", type=int, default=None, help="checkpoint step (default: the latest)")
  args = parser.parse_args(argv)
  settings = Settings.from_config(load_run_config(args.workdir))  # checked when the run started
  tokenizer, _ = build.build_tokenizer_and_task(settings)
  mesh = make_meshes(settings)[0]  # the trainer's, as the run laid out its parameters
  graphdef, params = build.build_model(settings, tokenizer, mesh)
  params, step = restore_run_params(args.workdir, params, args.step)
  write_hf_model(graphdef, params, settings.model.hf_path, tokenizer, args.out)
  print(f"{args.workdir}: checkpoint {step} -> {args.out}")


if __name__ == "__main__":
  main()

"""Every command's mistakes (issue 44): a missing path, a misspelt preset, a bad value each end in one line naming
the problem, exit code 2 and no traceback; --debug shows the traceback. Each command runs as a user runs it, in
its own process (`python -m grpo_jax.commands.X`, what the grpo-X console script and scripts/X.py call)."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT = os.path.join(ROOT, "experiments", "default.py")
VARIANTS = os.path.join(ROOT, "experiments", "ablation_variants.py")  # a sweep file


def command(name: str, *args: str, cwd=ROOT):
  return subprocess.run([sys.executable, "-m", f"grpo_jax.commands.{name}", *args], capture_output=True, text=True,
                        timeout=300, cwd=cwd)


def one_line(proc, prog: str, *words: str) -> str:
  assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
  lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
  assert lines and lines[-1].startswith(f"{prog}: error: ") and all(w in lines[-1] for w in words), lines
  return lines[-1]


@pytest.mark.parametrize("name, args", [("evaluate", []), ("export", ["out_dir"]), ("plot", []), ("report", [])])
def test_a_missing_run_or_sweep_directory(tmp_path, name, args):
  missing = str(tmp_path / "no_such_run")
  one_line(command(name, missing, *args), f"grpo-{name}", missing, "does not exist")


def test_debug_shows_the_traceback(tmp_path):
  proc = command("plot", str(tmp_path / "no_such_run"), "--debug")
  assert proc.returncode != 0 and "Traceback" in proc.stderr and "FileNotFoundError" in proc.stderr


@pytest.mark.parametrize("name, args", [("train", ["--workdir", "WORKDIR", "--config", DEFAULT + ":tset"]),
                                        ("evaluate", ["--config", DEFAULT + ":tset"]),
                                        ("sweep", ["--config", VARIANTS + ":tset", "--sweep_dir", "WORKDIR",
                                                   "--print_commands"])])
def test_a_misspelt_preset_names_the_known_ones(tmp_path, name, args):
  args = [str(tmp_path / "w") if a == "WORKDIR" else a for a in args]
  line = one_line(command(name, *args), f"grpo-{name}", "unknown preset 'tset'", "known: test")
  assert len(line) < 400  # the cause, not a traceback folded into one line


def test_a_misspelt_reward_is_the_mistake_named(tmp_path):
  proc = command("train", "--config", DEFAULT + ":test", "--workdir", str(tmp_path / "w"),
                 '--config.rewards={"exact_macth": 1.0}')
  one_line(proc, "grpo-train", "rewards.exact_macth", "unknown reward", "did you mean 'exact_match'")


def test_bad_member_resources_are_refused_before_the_sweep_is_written(tmp_path):
  pytest.importorskip("ray")
  sweep_dir = tmp_path / "sweep"
  proc = command("sweep", "--config", VARIANTS, "--sweep_dir", str(sweep_dir), "--backend", "ray",
                 "--member_resources", '{"GPU": 0}')
  one_line(proc, "grpo-sweep", "--member_resources", "'GPU' must be a number > 0")
  assert not sweep_dir.exists()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
  """A run directory as training leaves it, without checkpoints: config.json and a few metrics rows."""
  from grpo_jax.sweep.spec import load_module
  workdir = tmp_path_factory.mktemp("run")
  (workdir / "config.json").write_text(load_module(DEFAULT).get_config("test").to_json_best_effort())
  (workdir / "metrics.jsonl").write_text("".join(f'{{"step": {i}, "reward": 0.5, "eval/accuracy": 0.25}}\n'
                                                 for i in range(3)))
  return str(workdir)


@pytest.mark.parametrize("name, args, words", [
    ("evaluate", ["RUN", "--set", "three_digits"], ("--set 'three_digits'", "its sets: heldout")),
    ("export", ["RUN", "OUT", "--step", "7"], ("has no checkpoint 7",)),
    ("plot", ["RUN", "--metrics", "eval/acuracy"], ("'eval/acuracy' was logged by none", "eval/accuracy")),
    ("report", ["RUN", "--group_by", "(.*_seed"], ("is not a regular expression",)),
    ("report", ["RUN", "--smooth", "0"], ("--smooth 0", "must be >= 1")),
    ("memory_estimate", ["--model", "qwen2.5-0.5b", "--mesh", "2x4"], ("--mesh '2x4'", "data,fsdp,tensor")),
    ("memory_estimate", ["--hf-config", "MISSING"], ("does not exist",)),
    ("sweep", ["--config", "MISSING", "--sweep_dir", "OUT"], ("experiment file", "does not exist"))])
def test_a_bad_value_or_missing_file_is_named(run_dir, tmp_path, name, args, words):
  args = [{"RUN": run_dir, "OUT": str(tmp_path / "out"), "MISSING": str(tmp_path / "nothing.json")}.get(a, a)
          for a in args]
  one_line(command(name, *args), "memory_estimate" if name == "memory_estimate" else f"grpo-{name}", *words)


@pytest.mark.parametrize("hf_path, words", [
    ("Qwen/Qwen2.5-0.5B-Instruct", ("a Hugging Face hub id", "downloads nothing",
                                    "hf download Qwen/Qwen2.5-0.5B-Instruct --local-dir")),
    ("models/gemma-3-270m-missing", ("is not a directory", "bash scripts/get_gemma3.sh")),
    ("models/SmolLM2-missing", ("is not a directory", "bash scripts/get_smollm2.sh")),
    ("/nowhere/my-model", ("is not a directory", "hf download <org>/my-model --local-dir /nowhere/my-model"))])
def test_a_missing_model_says_how_to_get_it(tmp_path, hf_path, words):
  proc = command("train", "--config", os.path.join(ROOT, "experiments", "gsm8k.py:test"), "--workdir",
                 str(tmp_path / "w"), f"--config.model.hf_path={hf_path}")
  one_line(proc, "grpo-train", "config.model.hf_path", *words)


def test_evaluation_progress_lines_say_what_is_left():
  import io
  from grpo_jax.commands.evaluate import batch_lines
  out = io.StringIO()
  on_batch = batch_lines(every_s=0.0, stream=out)
  for done in range(1, 5):
    on_batch(done, 4)
  lines = out.getvalue().splitlines()
  assert lines[0].startswith("[eval] sampler call 1/4 (compiling) took ") and len(lines) == 4, lines
  assert lines[1].startswith("[eval] sampler call 2/4, ~") and lines[1].endswith(" s left") and lines[3] == \
      "[eval] sampler call 4/4"
  quiet = io.StringIO()  # a line at most every 10 s: a fast evaluation prints the first call and the last
  on_batch = batch_lines(stream=quiet)
  for done in range(1, 5):
    on_batch(done, 4)
  assert [line.split(" took")[0].split(",")[0] for line in quiet.getvalue().splitlines()] == [
      "[eval] sampler call 1/4 (compiling)", "[eval] sampler call 4/4"]


@pytest.mark.parametrize("hf, words", [
    ({"model_type": "gpt_oss", "architectures": ["GptOssForCausalLM"], "quantization_config": {"quant_method": "mxfp4"}},
     ["'mxfp4'", "dequantized copy"]),
    ({"model_type": "mixtral", "architectures": ["MixtralForCausalLM"]}, ["mixtral", "Qwen3-MoE and gpt-oss"]),
    ({"model_type": "qwen3_5_text", "architectures": ["Qwen3_5ForCausalLM"], "vocab_size": 8, "hidden_size": 8,
      "intermediate_size": 8, "num_hidden_layers": 2, "num_attention_heads": 1, "num_key_value_heads": 1,
      "layer_types": ["linear_attention", "mamba"]}, ["'mamba'", "'linear_attention' and 'full_attention'"]),
])
def test_a_checkpoint_grpo_jax_cannot_read_is_named_before_anything_loads(tmp_path, hf, words):
  import json
  (tmp_path / "ckpt").mkdir()
  (tmp_path / "ckpt" / "config.json").write_text(json.dumps(hf))
  proc = command("train", "--config", DEFAULT + ":test", "--workdir", str(tmp_path / "w"),
                 f"--config.model.hf_path={tmp_path / 'ckpt'}")
  one_line(proc, "grpo-train", "config.model.hf_path", *words)


def test_an_expert_axis_that_does_not_divide_the_experts(tmp_path):
  proc = command("train", "--config", DEFAULT + ":test", "--workdir", str(tmp_path / "w"),
                 "--config.moe.num_experts=6", "--config.mesh.expert=4")
  one_line(proc, "grpo-train", "config.mesh.expert=4", "does not divide moe.num_experts=6")

"""docs/guide.md's "Your first day: five recipes", run as written: each ```bash block of the section in order, in a
fresh directory that has the repository's scripts/ and experiments/, with HOME holding `models/my-model` (the
tiny random checkpoint) and `python` the interpreter running the tests. Then what each recipe promises is there."""
import json
import os
import re
import subprocess
import sys

from grpo_jax import testing

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def first_day_blocks() -> list[str]:
  with open(os.path.join(ROOT, "docs", "guide.md")) as f:
    guide = f.read()
  section = guide.split("## Your first day", 1)[1].split("\n## ", 1)[0]
  return re.findall(r"```bash\n(.*?)```", section, flags=re.S)


def steps_logged(workdir: str) -> list[dict]:
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [r for r in map(json.loads, f) if "event" not in r and r.get("step", 0) >= 1]


def test_the_five_recipes_run_as_written(tmp_path):
  blocks = first_day_blocks()
  assert len(blocks) == 5, "the section's five recipes, one bash block each"
  for name in ("scripts", "experiments"):
    os.symlink(os.path.join(ROOT, name), tmp_path / name)
  (tmp_path / "home" / "models").mkdir(parents=True)
  os.symlink(testing.ensure_fixtures()["checkpoint"], tmp_path / "home" / "models" / "my-model")
  env = dict(os.environ, HOME=str(tmp_path / "home"),
             PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
  for block in blocks:
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, f"{block}\nexit {done.returncode}:\n{done.stderr[-3000:]}"

  runs = tmp_path / "runs"
  with open(runs / "my_model" / "config.json") as f:
    assert json.load(f)["model"]["hf_path"].endswith("models/my-model")
  assert [r["step"] for r in steps_logged(runs / "my_model")] == [1, 2]
  assert all("rewards/my_rewards:brevity/mean" in r for r in steps_logged(runs / "my_reward"))
  assert [r["step"] for r in steps_logged(runs / "my_data")] == [1, 2, 3, 4]  # 2 steps, then 2 more on resume
  assert (tmp_path / "my_curves.png").stat().st_size > 10_000

"""metrics.jsonl and samples.jsonl on a store, which cannot append: rows are stored at each flush (the loop's,
before each checkpoint save), so a kill loses none up to the saved step; a resume drops the rows past it."""
from __future__ import annotations

from etils import epath

from grpo_jax import storage
from grpo_jax.persist.layout import RunFiles
from grpo_jax.persist.metrics import MetricsWriter, read_jsonl


def test_rows_up_to_the_last_flush_survive_a_kill_and_a_resume_drops_the_rest(store):
  workdir = store.url()
  writer = MetricsWriter(workdir, tensorboard=True)
  for step in range(5):
    writer.write(step, {"reward": step / 10})
    writer.write_samples(step, [{"prompt": "1+1=", "completion": "2", "reward": 1.0}])
    if step == 2:
      writer.flush()  # checkpoint 2 is saved after this
  # Killed here: never closed. The store holds exactly the rows up to the flush.
  assert [r["step"] for r in read_jsonl(RunFiles(workdir).metrics)] == [0, 1, 2]
  assert [r["step"] for r in read_jsonl(RunFiles(workdir).samples)] == [0, 1, 2]
  events = storage.listdir(storage.join(workdir, "tensorboard"))
  assert len(events) == 1 and events[0].startswith("events.out.tfevents")

  resumed = MetricsWriter(workdir, tensorboard=True, resume_step=1)  # checkpoint 1 was the last committed
  assert [r["step"] for r in read_jsonl(RunFiles(workdir).metrics)] == [0, 1]
  for step in (2, 3):
    resumed.write(step, {"reward": -step})
  resumed.close()
  rows = read_jsonl(RunFiles(workdir).metrics)
  assert [(r["step"], r["reward"]) for r in rows] == [(0, 0.0), (1, 0.1), (2, -2), (3, -3)]
  assert len(storage.listdir(storage.join(workdir, "tensorboard"))) == 2  # one event file per process, as locally
  writer.close()  # the "killed" writer's local TensorBoard directory
  epath.Path(workdir).rmtree(missing_ok=True)

"""The evaluation's figures, each registered once in FIGURES: its name (a pattern "pass@<k>" stands for every k),
its per-prompt estimator (grpo_jax/stats/estimators.py), its 95% interval over prompts (grpo_jax/stats/intervals.py),
whether it reads the greedy completion or the N samples, and the config.eval key that lists its k's, if any.
Training's evaluation, grpo-evaluate (its options and lines), the sweep report's tables and the plots read them
from here, so a new figure is one `@figure(...)` in one module. A figure F is logged as eval/F with its interval
eval/F/lo, eval/F/hi; a sample is correct when its accuracy reward is >= 1, and votes for its answer key
(grpo_jax/rewards/registry.py). No JAX here: the report and the plots import it.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Iterator, Mapping, Sequence

import numpy as np

from grpo_jax.registry import Registry, same_definition
from grpo_jax.stats import estimators, intervals

FIGURES = Registry("eval.samples", "evaluation figure")


@dataclasses.dataclass(frozen=True)
class Figure:
  """estimate(scores_PxN, answers_PxN, k) -> [P] per-prompt values; interval(values_P) -> an Interval; `greedy`: of
  the greedy completion (N = 1), not the samples; `ks`: the config.eval key listing its k's (None: once, k = N)."""
  name: str
  estimate: Callable
  interval: Callable = intervals.over_prompts
  greedy: bool = False
  ks: str | None = None

  def __call__(self, scores_PxN, answers_PxN, k: int) -> np.ndarray:  # a Registry's entries are callables
    return self.estimate(scores_PxN, answers_PxN, k)

  def metric(self, k: int) -> str:
    """Its metrics.jsonl key at `k` ("eval/pass@4")."""
    return "eval/" + (self.name.split("<")[0] + str(k) if "<" in self.name else self.name)


def figure(name: str, *, interval: Callable = intervals.over_prompts, greedy: bool = False, ks: str | None = None,
           overwrite: bool = False):
  """Decorator: registers `estimate(scores_PxN, answers_PxN, k) -> [P]` as the figure `name`, e.g.
  `@figure("worst@<n>")` over `def worst(scores_PxN, answers_PxN, k): return scores_PxN.min(axis=1)`; returns it.
  A taken name raises unless `overwrite` or the same function registers again (a reloaded module)."""
  def decorator(estimate: Callable) -> Callable:
    old = FIGURES._entries.get(name)  # pylint: disable=protected-access
    overwritten = overwrite or (old is not None and same_definition(old.estimate, estimate))
    FIGURES.register(name, overwrite=overwritten)(Figure(name, estimate, interval, greedy, ks))
    return estimate
  return decorator


def figures() -> Iterator[Figure]:
  """The registered figures in registration order: the order they are logged and printed in."""
  return map(FIGURES.get, FIGURES)


def figure_of(metric: str) -> Figure | None:
  """The figure whose value `metric` is ("eval/pass@4"), or None (its interval's keys, any other metric)."""
  k = metric.rpartition("@")[2]
  return next((f for f in figures() if f.metric(int(k) if k.isdigit() else 0) == metric), None)


def asked(eval_settings) -> dict[str, tuple[int, ...]]:
  """config.eval key -> the k's it asks for, of every figure that has one ({"pass_k": (1, 4), "maj_k": ()})."""
  return {f.ks: tuple(getattr(eval_settings, f.ks)) for f in figures() if f.ks}


def computed(scores_PxN, answers_PxN: Sequence[Sequence], *, greedy: bool,
             ks: Mapping[str, Sequence[int]] | None = None, methods: dict | None = None) -> dict[str, float]:
  """{eval/F: the mean over prompts, eval/F/lo, eval/F/hi} of each figure of the greedy completion (`greedy`,
  scores [P, 1]) or of the N samples, at each k its key asks for in `ks`; methods[eval/F]: the interval's method."""
  scores_PxN, out = np.asarray(scores_PxN, np.float64), {}
  for f in (f for f in figures() if f.greedy == greedy):
    for k in sorted(set((ks or {}).get(f.ks, ()))) if f.ks else [scores_PxN.shape[1]]:
      values_P, name = f(scores_PxN, answers_PxN, k), f.metric(k)
      ci = f.interval(values_P)
      out.update({name: float(np.mean(values_P)), f"{name}/lo": ci.lo, f"{name}/hi": ci.hi})
      if methods is not None:
        methods[name] = ci.method
  return out


figure("accuracy", greedy=True)(lambda scores_PxN, answers_PxN, k: scores_PxN[:, 0])
figure("full_credit", greedy=True)(lambda scores_PxN, answers_PxN, k: (scores_PxN[:, 0] >= 1.0).astype(np.float64))
figure("avg@<n>")(lambda scores_PxN, answers_PxN, k: estimators.avg_at_n_P(scores_PxN))
figure("pass@<k>", ks="pass_k")(lambda scores_PxN, answers_PxN, k: estimators.pass_at_k_P(scores_PxN >= 1.0, k))
figure("maj@<k>", ks="maj_k")(lambda scores_PxN, answers_PxN, k: estimators.maj_at_k_P(answers_PxN, scores_PxN >= 1, k))

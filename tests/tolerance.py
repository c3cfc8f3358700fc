"""Float32 comparisons that hold on any CPU. XLA:CPU picks its kernels, vector widths and reduction orders per
machine, so two different programs computing the same quantity (split and whole, shared and per-row, JAX and
numpy) agree to a few float32 roundings of the quantity's scale, not of each element: an element near zero of an
array whose others are ~1 carries their absolute rounding error, and atol=0 holds it to a precision that only
some machines give. Exact equality stays where the same program runs twice on the same machine (a resume, a
determinism check) or where the arithmetic is exact (adding zero, scaling by 2)."""
from __future__ import annotations

import jax
import numpy as np

EPS32 = float(np.finfo(np.float32).eps)


def assert_close_f32(actual, expected, *, ulps: float, scale=None, err_msg: str = "") -> None:
  """|actual - expected| <= ulps * EPS32 * scale elementwise, leaf by leaf for pytrees (NaN matches NaN).

  scale: each leaf's max|expected| by default; pass the magnitude the values came from where it is larger (the
  sum of |terms| of a sum that cancels), or an array of per-element scales. ulps: a few for a short computation,
  more for long reductions and chains of them (say why at the call).
  """
  for i, (a, e) in enumerate(zip(jax.tree.leaves(actual), jax.tree.leaves(expected), strict=True)):
    a, e = np.asarray(a, np.float64), np.asarray(e, np.float64)
    s = np.abs(e[np.isfinite(e)]).max(initial=0.0) if scale is None else np.asarray(scale, np.float64)
    a, e, s = np.broadcast_arrays(a, e, s)
    allowed = ulps * EPS32 * s
    with np.errstate(invalid="ignore"):  # inf - inf
      bad = ~((np.abs(a - e) <= allowed) | (a == e) | (np.isnan(a) & np.isnan(e)))  # equal infinities pass
    if bad.any():
      j = np.unravel_index(np.argmax(np.where(bad, np.nan_to_num(np.abs(a - e), nan=np.inf) - allowed, -np.inf)),
                           bad.shape)
      raise AssertionError(f"{err_msg} (leaf {i}) {bad.sum()} of {bad.size} elements differ by more than {ulps} "
                           f"float32 ulps of their scale; the worst, at {tuple(map(int, j))}: {float(a[j])!r} vs {float(e[j])!r}, "
                           f"off by {abs(a[j] - e[j]):.3g}, allowed {allowed[j]:.3g} (scale {s[j]:.3g})")

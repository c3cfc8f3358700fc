"""Independent float64 numpy references for grpo_jax.algo, written from the formulas (docs/algorithms.md), one
completion at a time with plain loops, sharing no code with the package."""
from __future__ import annotations

import math

import numpy as np


def advantages(rewards, G, method, ddof=1, eps=1e-4):
  r = np.asarray(rewards, np.float64).reshape(-1)
  out = np.zeros_like(r)
  groups = [r[k:k + G] for k in range(0, len(r), G)]
  if method == "batch":
    centred = np.concatenate([g - g.mean() for g in groups])
    n = len(centred)
    batch_std = math.sqrt(sum(c * c for c in centred) / max(n - ddof, 1))
  for p, g in enumerate(groups):
    for j in range(G):
      if np.all(g == g[0]):
        a = 0.0
      elif method == "grpo":
        mean = sum(g) / G
        std = math.sqrt(sum((x - mean) ** 2 for x in g) / (G - ddof))
        a = (g[j] - mean) / (std + eps)
      elif method == "dr_grpo":
        a = g[j] - sum(g) / G
      elif method == "rloo":
        a = g[j] - (sum(g) - g[j]) / (G - 1)   # leave-one-out baseline, written directly
      elif method == "batch":
        a = (g[j] - sum(g) / G) / (batch_std + eps)
      out[p * G + j] = a
  return out


def kl(name, logp, ref):
  logp, ref = np.float64(logp), np.float64(ref)
  if name == "k1":
    return logp - ref
  if name == "k2":
    return 0.5 * (ref - logp) ** 2
  d = ref - logp                               # log(π_ref / π_θ)
  return np.expm1(d) - d                       # float64: exp(d) − d − 1 without losing small values


def entropy(logits):
  z = np.asarray(logits, np.float64)
  p = np.exp(z - z.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  with np.errstate(divide="ignore", invalid="ignore"):
    return -np.sum(np.where(p > 0, p * np.log(p), 0.0), axis=-1)


def top_entropy_select(ent, lengths, q):
  """list of bool arrays, one per completion."""
  real = np.concatenate([ent[i, :n] for i, n in enumerate(lengths)]) if sum(lengths) else np.zeros(0)
  if len(real) == 0:
    return [np.zeros(0, bool) for _ in lengths]
  thr = np.quantile(real, 1.0 - q)              # linear interpolation, numpy's default
  return [ent[i, :n] >= thr for i, n in enumerate(lengths)]


def aggregate(per_seq_tokens, mode, C_max):
  """per_seq_tokens: list of 1-D float64 arrays (the real tokens' losses). Returns the scalar loss."""
  nonempty = [x for x in per_seq_tokens if len(x)]
  if not nonempty:
    return 0.0
  if mode == "seq_mean_token_mean":
    return sum(x.mean() for x in nonempty) / len(nonempty)
  if mode == "token_mean":
    return sum(x.sum() for x in nonempty) / sum(len(x) for x in nonempty)
  if mode == "seq_mean_token_sum_norm":
    return sum(x.sum() for x in nonempty) / (len(nonempty) * C_max)
  raise ValueError(mode)


def policy_term(lp, old, A, cfg):
  """Per-token policy loss and clip flags (low, high) for one completion's real tokens."""
  lp, old = np.float64(lp), np.float64(old)
  n = len(lp)
  eps_lo = cfg["epsilon_low"]
  eps_hi = eps_lo if cfg.get("epsilon_high") is None else cfg["epsilon_high"]
  if cfg["policy_loss"] == "cispo":
    r = np.exp(lp - old)
    cap = cfg["cispo_epsilon_high"]
    w = np.minimum(r, cap)
    return -w * A * lp, np.zeros(n, bool), r > cap
  if cfg["importance_level"] == "sequence":
    r = np.full(n, math.exp(np.mean(lp - old))) if n else np.zeros(0)
  else:
    r = np.exp(lp - old)
  loss = np.empty(n)
  for t in range(n):
    unclipped = r[t] * A
    clipped = min(max(r[t], 1 - eps_lo), 1 + eps_hi) * A
    loss[t] = -min(unclipped, clipped)
    if cfg.get("delta") is not None and A < 0:
      loss[t] = min(loss[t], -cfg["delta"] * A)
  low = (r < 1 - eps_lo) & (A < 0)
  high = (r > 1 + eps_hi) & (A > 0)
  return loss, low, high


def objective(logp, old, ref, adv, lengths, ent, cfg):
  """(loss, metric means) of the whole batch. old None means old = logp; ref None means no KL."""
  B = len(lengths)
  C_max = cfg.get("max_completion_length") or logp.shape[1]
  sel = None
  if cfg.get("top_entropy_quantile") is not None:
    sel = top_entropy_select(ent, lengths, cfg["top_entropy_quantile"])
  per_seq, kls, ents, pols, lows, highs, sels = [], [], [], [], [], [], []
  for i in range(B):
    n = lengths[i]
    lp = logp[i, :n]
    ol = lp if old is None else old[i, :n]
    pol, low, high = policy_term(lp, ol, adv[i], cfg)
    pols.append(pol); lows.append(low); highs.append(high)
    total = pol.copy()
    if sel is not None:
      total = np.where(sel[i], total, 0.0)
      sels.append(sel[i])
    if ref is not None:
      k = kl(cfg["kl_estimator"], lp, ref[i, :n])
      kls.append(k)
      total = total + cfg["beta"] * k
    if ent is not None:
      ents.append(np.float64(ent[i, :n]))
      total = total - cfg.get("entropy_coef", 0.0) * np.float64(ent[i, :n])
    per_seq.append(total)
  loss = aggregate(per_seq, cfg["aggregation"], C_max)
  n_tok = sum(lengths)

  def mean(xs):
    return float(sum(np.sum(x) for x in xs) / n_tok) if n_tok else 0.0

  metrics = {"policy_loss": mean(pols), "clip_ratio/low": mean(lows), "clip_ratio/high": mean(highs),
             "clip_ratio/region": mean([l | h for l, h in zip(lows, highs)])}
  if ref is not None:
    metrics["kl"] = mean(kls)
  if ent is not None:
    metrics["entropy"] = mean(ents)
  if sel is not None:
    metrics["entropy_selected"] = mean(sels)
  return loss, metrics

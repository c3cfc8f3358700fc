"""KV-cache sampler: one jitted prefill over the left-padded prompts, then one jitted `lax.while_loop` decode
that feeds one token per step into a static cache of length S = P + C. docs/guide.md ("Sampling") gives its
settings, its guarantees as tested and its measurements; here, what the code relies on.

Shapes: R distinct prompts (bucketed), G completions per prompt (`repeats`), B = R x G rows, P prompt length
(bucketed), C = max_new_tokens, S = P + C cache slots, D hidden size, V vocabulary. `generate(..., repeats=G)`
runs the prefill on the R distinct prompts and repeats each one's KV cache and last-position logits G times
(rows r*G .. r*G + G - 1), which then differ only through their own uniforms. Completions come back C wide
(pad_id, mask 0 after a row stopped: one completion shape per run), prompts left-padded to P (extra columns mask
0); dummy rows added to reach the batch bucket are dropped.

Layout: prompts are LEFT-padded, so every row writes its step-t key/value at the same cache slot P + t - 1
(the token sampled at step t - 1), while position ids differ per row (`positions_from_mask`: the prompt's
first real token is position 0). Query rows attend to prompt slots holding real tokens and to completion
slots already written. Prefill and every loop step run the model's own cached forward (`Transformer.__call__`
with T = P, then T = 1), which updates the KV cache (`init_cache`: keys [B, K, H, S], values [B, K, S, H]) in
place. The rotary tables and the uniforms of every step are computed once per call, outside the loop.
Decode segments (`SamplingConfig.decode_segment` = `seg` > 0): segment k's cache holds only the P + (k + 1) seg
slots filled by its end (the prefill writes P + seg; each later segment pads the cache to its width,
`transformer.extend_cache`; `decode_segments` gives the widths); attention to an unwritten slot is masked out
either way, so the tokens and log-probs are those of one segment. Sliding-window layers (Gemma 3) keep a ring
buffer of min(sliding_window, S) slots (`transformer.init_cache`).

Continuous batching (`SamplingConfig.slots` > 0): the prefill keeps the R prompts' caches (not repeated G times),
and the decode runs `slots` rows at a time: every `stop_check_every` steps each idle slot takes the next row not
yet started, in (prompt, sample) order, copying its prompt's cache; a slot holding row b at token t feeds token
t - 1 at cache slot P + t - 1 with row b's rotary angles and draws token t from u[t, b], the static decode's
uniform (the per-row cache index is `Transformer.__call__`'s [B] cache_index), so a row's cache, inputs and
uniforms are those of its static row. Refills wait for the chunk's end (no copy, no test inside the chunk's
static loop), so a slot freed mid-chunk idles up to `stop_check_every` - 1 steps. Not with decode segments (a
segment's width needs every row at one step). MoE experts are recorded for every token fed, which here excludes
the stop token and the pads after it (zeros there; the static decode records what its forward of those chose).

Keyed rows and pieces (`generate(..., row_keys=, prefixes=, budget=)`): row b's completion token j draws
uniform(fold_in(row_keys[b], j)) (`_Keyed.uniforms`) instead of the call key's table. `budget` is a per-row cap
in the decode's `done` test (an input, not a shape; rows that reach it come back `unfinished_B`); row b's prefix of
k_b completion tokens is prefilled with its prompt (the call's prompt width is that of prompt + prefix), and its
new tokens start at index k_b, drawing the uniforms of k_b, k_b + 1, ..., until k_b + new = C. Prefixes need
`repeats` = 1, and a prefixed result has no experts (the prefix's routing would be the new weights').

Devices: on a mesh of several devices (the parameters' or `mesh=`) the batch is split along the 'data' and
'fsdp' axes, each device decoding its own rows with the parameters as they are sharded; the batch bucket is
rounded up to a multiple of data * fsdp, and the results are gathered for the host. Continuous batching splits
its slots the same way, but any slot may take any row: XLA's partitioner moves the rows with collectives.
"""
from __future__ import annotations

import collections
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from grpo_jax.model.logprobs import positions_from_mask
from grpo_jax.model.sharding import batch_axes
from grpo_jax.model.transformer import cast_for_compute, extend_cache, init_cache
from grpo_jax.sampling.buckets import bucket_size, left_pad
from grpo_jax.sampling.config import SamplingConfig
from grpo_jax.sampling.select import select_next_token


class SampleResult(NamedTuple):
  """numpy arrays; B = number of prompts given, P = bucketed prompt length, C = max_new_tokens."""
  prompt_BxP: np.ndarray           # int32, left padded with pad_id
  prompt_mask_BxP: np.ndarray      # int32, 1 on real prompt tokens
  completion_BxC: np.ndarray       # int32, pad_id after the row stopped
  completion_mask_BxC: np.ndarray  # int32, 1 up to and including the stop token
  logp_BxC: np.ndarray             # float32 log_softmax(logits / T)[token]; 0 where the mask is 0
  lengths_B: np.ndarray            # int32 completion lengths (sum of the mask)
  truncated_B: np.ndarray          # bool, no stop id within max_new_tokens
  # Mixtures of experts: the experts the sampler's forward chose for each prompt and completion token it ran, per
  # expert layer (int16, [B, P + C, layers, k]; the last completion column, never fed back, holds zeros). None
  # for a dense model.
  experts_BxTxLxk: np.ndarray | None = None
  # Keyed rows (`generate(row_keys=...)`, else None): the completion columns start_B .. lengths_B - 1 are this call's
  # new tokens (those before are the row's prefix, logp 0 there); unfinished rows reached the call's budget without
  # a stop id, before max_new_tokens (a row is stopped, truncated or unfinished).
  start_B: np.ndarray | None = None       # int32, the prefix's length
  unfinished_B: np.ndarray | None = None  # bool


def decode_segments(P: int, C: int, segment: int) -> list[tuple[int, int]]:
  """(end step, cache width) of each decode segment: steps [previous end, end) run on a cache of `width` = P +
  end slots, which holds every key they attend to (step t writes slot P + t - 1). One segment of width P + C
  when `segment` is 0 or >= C."""
  if not segment or segment >= C:
    return [(C, P + C)]
  return [(end, P + end) for end in [*range(segment, C, segment), C]]


def state_mesh(state) -> jax.sharding.Mesh | None:
  """The mesh of several devices that `state`'s arrays are laid out on (read from its first array), else None."""
  leaves = jax.tree.leaves(state)
  sharding = getattr(leaves[0], "sharding", None) if leaves else None
  if isinstance(sharding, NamedSharding) and sharding.mesh.size > 1:
    return sharding.mesh
  return None


def _split_batch(tree, mesh):
  """Constrains each array's leading axis to be split over the batch axes (no-op without a mesh)."""
  if mesh is None:
    return tree
  return jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x, NamedSharding(
      mesh, PartitionSpec(batch_axes(mesh), *[PartitionSpec.UNCONSTRAINED] * (x.ndim - 1)))), tree)


def _replicate(tree, mesh):
  if mesh is None:
    return tree
  return jax.lax.with_sharding_constraint(tree, NamedSharding(mesh, PartitionSpec()))


class _Decoding(NamedTuple):
  """Decode-loop state besides the KV cache."""
  step: jax.Array          # scalar int32: number of completion tokens emitted so far
  tokens_BxC: jax.Array    # int32
  mask_BxC: jax.Array      # int32
  logp_BxC: jax.Array      # float32
  done_B: jax.Array        # bool: emitted a stop id (dummy rows start done)
  # Mixtures of experts (else None): the experts chosen for the prompt, and for each completion token when fed.
  prompt_experts_BxPxLxk: jax.Array | None = None
  experts_BxCxLxk: jax.Array | None = None


class _Keyed(NamedTuple):
  """Keyed rows (`generate(row_keys=...)`), given to the prefill and decode programs instead of the call's key."""
  key_data_BxK: jax.Array  # uint32: jax.random.key_data of each row's key
  start_B: jax.Array       # int32: completion tokens the row already has (its prefix, fed as part of its prompt)
  cap_B: jax.Array         # int32: at most this many new tokens, min(budget, C - start)

  def uniforms(self, n: int) -> jax.Array:
    """[n, B]: the uniforms of each row's next n tokens, u[t, b] = uniform(fold_in(key_b, start_b + t)): keyed by
    (row, index in the whole completion), so neither the batch, nor the row's position, nor the piece matters."""
    draw = lambda key, j: jax.random.uniform(jax.random.fold_in(key, j))
    return jax.vmap(jax.vmap(draw, (None, 0)), (0, 0), out_axes=1)(
        jax.random.wrap_key_data(self.key_data_BxK), self.start_B[:, None] + jnp.arange(n)[None])


class _Slots(NamedTuple):
  """Continuous batching's slots (S of them)."""
  row_S: jax.Array    # int32: the row each slot decodes; B when idle
  t_S: jax.Array      # int32: the token index its next step emits (1 .. C - 1)
  started: jax.Array  # scalar int32: rows of the queue given a slot so far
  steps: jax.Array    # scalar int32: token steps run


def _stacked_experts(routing):
  """[B, T, layers, k] int16 of a forward's routing (Transformer(..., with_routing=True)); None without experts."""
  return jnp.stack([experts for _, experts in routing], axis=2).astype(jnp.int16) if routing else None


class Sampler:
  """`Sampler(graphdef, cfg).generate(state, prompts, key)` with `graphdef, state = nnx.split(model)`.

  `state` may be the trainer's live parameters: it is read, never donated or copied. On a mesh the batch is
  split along 'data'/'fsdp' (see the module docstring); `mesh=` sets it when the state is on one device.
  Each (batch bucket, prompt-length bucket, repeats) compiles one prefill, one decode and one small
  rotary-table program, and keyed rows (`row_keys`) one more prefill and decode; `trace_counts` counts them.

  prompt_bucket_min / prompt_bucket_step and batch_bucket_step set the buckets (see `buckets.bucket_size`):
  lengths round up along 2^k and 1.5 x 2^k from prompt_bucket_min up to prompt_bucket_step, then to multiples
  of it; batch sizes likewise up to batch_bucket_step. `prompt_widths` (ascending) replaces the length buckets
  by a fixed list: prompts are padded to the smallest width that holds the longest (the trainer uses the same
  widths as the update, `grpo.length_buckets`).

  `slot_steps` and `kept_slot_steps` count, over every `generate` call, the decode's token steps times the rows
  they ran (static: the row bucket; continuous batching: the slots) and those that emitted a kept token (mask 1;
  the prefill's first token is not a decode step): their ratio is the slot utilization.

  Early stop: the decode loop ends once every row has emitted a stop id, tested every `stop_check_every`
  steps (so up to that many - 1 extra steps run, all masked). Between tests the token steps run in a loop of a
  static trip count, which XLA:GPU runs without waiting on the host.
  """

  def __init__(self, graphdef: nnx.GraphDef, cfg: SamplingConfig, *, prompt_bucket_min: int = 16,
               prompt_bucket_step: int = 128, batch_bucket_step: int = 64,
               prompt_widths: tuple[int, ...] | None = None,
               mesh: jax.sharding.Mesh | None = None, stop_check_every: int = 8):
    if not isinstance(cfg, SamplingConfig):
      raise TypeError(f"Sampler: cfg must be a SamplingConfig, got {type(cfg).__name__}")
    if not isinstance(stop_check_every, int) or stop_check_every < 1:
      raise ValueError(f"Sampler: stop_check_every={stop_check_every!r} must be an int >= 1")
    if prompt_widths is not None:
      prompt_widths = tuple(int(w) for w in prompt_widths)
      if not prompt_widths or list(prompt_widths) != sorted(set(prompt_widths)) or prompt_widths[0] < 1:
        raise ValueError(f"Sampler: prompt_widths={prompt_widths!r} must be distinct positive ints, ascending")
    self.prompt_widths = prompt_widths
    self.graphdef = graphdef
    self.cfg = cfg
    self.prompt_bucket_min = prompt_bucket_min
    self.prompt_bucket_step = prompt_bucket_step
    self.batch_bucket_step = batch_bucket_step
    self.stop_check_every = stop_check_every
    self.mesh = mesh  # None: the mesh of the state passed to `generate`, if it spans several devices
    self.trace_counts = collections.Counter()  # incremented while tracing: one per compiled program
    self._vocab_size = None
    self.last_cache_sharding = None
    self.last_num_steps = 0  # token steps of the last call, the prefill's included (static: columns generated)
    self.slot_steps = 0       # decode token steps x rows (static: the row bucket; continuous: the slots), all calls
    self.kept_slot_steps = 0  # those that emitted a kept token (mask 1): kept / slot_steps is the slot utilization
    # `mesh` (static) is the mesh the batch is split over, or None; `repeats` (static) is G.
    self._prefill = jax.jit(self._prefill_fn, static_argnames=("mesh", "repeats", "keep_prompts"))
    self._prompt_rope = jax.jit(self._prompt_rope_fn)
    # The cache and the output buffers produced by prefill are updated in place by the loop. With several decode
    # segments the cache grows (each segment pads it), so the prefill's cannot be the output: not donated.
    one_segment = len(decode_segments(0, cfg.max_new_tokens, cfg.decode_segment)) == 1
    self._decode = jax.jit(self._decode_fn, donate_argnums=(1, 2) if one_segment else (2,), static_argnames="mesh")
    # Continuous batching reads the prompts' caches (copied into slots) and builds the slots' own: only `dec` donated.
    self._continuous = jax.jit(self._continuous_fn, donate_argnums=(2,), static_argnames=("mesh", "repeats",
                                                                                            "slots"))

  # ---- traced programs ----

  def _prompt_rope_fn(self, state, prompt_mask_BxP):
    """The prompt's rotary tables, computed by their own program: given to the prefill as inputs, they are
    evaluated once; computed inside the prefill, XLA re-evaluated them in each layer's fused kernels."""
    self.trace_counts["prompt_rope"] += 1
    return nnx.merge(self.graphdef, state).rope_tables(positions_from_mask(prompt_mask_BxP))

  def _prefill_fn(self, state, prompt_RxP, prompt_mask_RxP, row_valid_B, key, rope_cos_sin, mesh, repeats,
                  keep_prompts=False, keyed: _Keyed | None = None):
    """Writes the R prompts' keys/values into a fresh cache, repeats each prompt's cache rows and last logits
    `repeats` = G times (B = R x G rows), and samples every row's first completion token. `keep_prompts`
    (continuous batching): the cache keeps its R rows, which slots copy when a row starts."""
    self.trace_counts["prefill"] += 1
    cfg = self.cfg
    model = nnx.merge(self.graphdef, state)
    R, P = prompt_RxP.shape
    B = R * repeats
    C = cfg.max_new_tokens
    S = decode_segments(P, C, cfg.decode_segment)[0][1]  # the cache slots of the first decode segment
    cache = _split_batch(init_cache(model.cfg, R, S), mesh)
    causal_PxS = jnp.arange(S)[None, :] <= jnp.arange(P)[:, None]
    key_ok_RxS = jnp.pad(prompt_mask_RxP.astype(bool), ((0, 0), (0, S - P)))
    attn_RxPxS = causal_PxS[None] & key_ok_RxS[:, None, :]
    hidden_RxPxD, cache, routing = model(prompt_RxP, None, attn_RxPxS, cache, 0, rope_cos_sin=rope_cos_sin,
                                         with_routing=True)
    experts = _stacked_experts(routing)
    # Left padding puts every row's last prompt token in column P - 1.
    logits_RxV = model.logits(hidden_RxPxD[:, -1:])[:, 0]
    if repeats > 1:
      # Row r*G + g copies prompt r. With R split over devices in contiguous blocks, so is B: the copy is local.
      if not keep_prompts:
        cache = _split_batch(jax.tree.map(lambda x: jnp.repeat(x, repeats, axis=0), cache), mesh)
      logits_BxV = jnp.repeat(logits_RxV, repeats, axis=0)
      experts = None if experts is None else jnp.repeat(experts, repeats, axis=0)
    else:
      logits_BxV = logits_RxV
    u_B = jax.random.uniform(jax.random.fold_in(key, 0), (B,)) if keyed is None else keyed.uniforms(1)[0]
    token_B, logp_B = select_next_token(logits_BxV, u_B, cfg)
    token_B = jnp.where(row_valid_B, token_B, cfg.pad_id)
    ends_B = self._is_stop(token_B) if keyed is None else self._is_stop(token_B) | (keyed.cap_B <= 1)
    state0 = _Decoding(
        step=jnp.ones((), jnp.int32),
        tokens_BxC=jnp.full((B, C), cfg.pad_id, jnp.int32).at[:, 0].set(token_B),
        mask_BxC=jnp.zeros((B, C), jnp.int32).at[:, 0].set(row_valid_B.astype(jnp.int32)),
        logp_BxC=jnp.zeros((B, C), jnp.float32).at[:, 0].set(jnp.where(row_valid_B, logp_B, 0.0)),
        done_B=~row_valid_B | ends_B, prompt_experts_BxPxLxk=experts,
        experts_BxCxLxk=None if experts is None else jnp.zeros((B, C, *experts.shape[2:]), experts.dtype))
    return cache, state0

  def _decode_fn(self, state, cache, dec: _Decoding, prompt_mask_BxP, key, mesh, keyed: _Keyed | None = None):
    """Emits tokens 1..C-1 (one per iteration) until every row is done or C tokens exist; keyed rows end at
    their cap too."""
    self.trace_counts["decode"] += 1
    cfg = self.cfg
    # Cast once per call, before the loop: each token step then reads the weights in the compute dtype.
    model = nnx.merge(self.graphdef, cast_for_compute(state, nnx.merge(self.graphdef, state).cfg))
    B, P = prompt_mask_BxP.shape
    C = cfg.max_new_tokens
    prompt_len_B = jnp.sum(prompt_mask_BxP, axis=1).astype(jnp.int32)
    # Every step's uniforms and rotary tables at once, before the loop: one kernel each per call rather than
    # per step (and the tables are not re-evaluated inside each layer's fused kernels).
    u_CxB = jax.random.uniform(jax.random.fold_in(key, 1), (C, B)) if keyed is None else keyed.uniforms(C)
    # Step t feeds the token emitted at step t - 1, at position prompt_len + t - 1.
    rope_BxC = model.rope_tables(prompt_len_B[:, None] + jnp.arange(C)[None, :] - 1)

    def segment_loop(cache, dec, start: int, end: int, S: int):
      """Steps `start` up to `end` (exclusive) on a cache of S slots."""
      key_ok_BxS = jnp.pad(prompt_mask_BxP.astype(bool), ((0, 0), (0, S - P)), constant_values=True)
      slots_S = jnp.arange(S)

      def chunks(carry, until: int, n: int):
        """While steps remain before `until` and a row is active: `n` steps at a time."""
        def cond(c):
          return (c[1].step < until) & ~jnp.all(c[1].done_B)

        # n is static: XLA:GPU then runs the inner loop with no test on the host between token steps. A while
        # loop of unknown trip count copies its condition to the host and waits for the device each iteration,
        # so the host would enqueue every token step's kernels while the GPU sat idle. The outer test, "every
        # row done" (a cross-device reduction when the batch is split), runs once per `stop_check_every` steps;
        # finished rows just emit masked pad tokens.
        return jax.lax.while_loop(
            cond, lambda c: jax.lax.fori_loop(0, n, lambda _, x: step(x, key_ok_BxS, slots_S), c), carry)

      # Whole chunks of `stop_check_every` steps, then the rest of the segment: the same steps and the same tests
      # as chunks of min(stop_check_every, steps left), with every inner trip count known when compiling.
      k = self.stop_check_every
      whole_end = start + (end - start) // k * k
      carry = (cache, dec)
      if whole_end > start:
        carry = chunks(carry, whole_end, k)
      if end > whole_end:
        carry = chunks(carry, end, end - whole_end)
      return carry

    def step(carry, key_ok_BxS, slots_S):
      cache, d = carry
      t = d.step
      slot = P + t - 1  # where the previous token's key/value goes
      prev_B = jax.lax.dynamic_index_in_dim(d.tokens_BxC, t - 1, axis=1, keepdims=False)
      attn_Bx1xS = (key_ok_BxS & (slots_S <= slot)[None])[:, None, :]
      rope_t = jax.tree.map(lambda x: jax.lax.dynamic_slice_in_dim(x, t, 1, axis=1), rope_BxC)
      hidden_Bx1xD, cache, routing = model(prev_B[:, None], None, attn_Bx1xS, cache, slot, rope_cos_sin=rope_t,
                                           with_routing=True)
      logits_BxV = model.logits(hidden_Bx1xD)[:, 0]
      token_B, logp_B = select_next_token(logits_BxV, u_CxB[t], cfg)
      active_B = ~d.done_B
      token_B = jnp.where(active_B, token_B, cfg.pad_id)
      logp_B = jnp.where(active_B, logp_B, 0.0)
      put = lambda buf_BxC, col_B: jax.lax.dynamic_update_index_in_dim(buf_BxC, col_B, t, axis=1)
      ends_B = self._is_stop(token_B) if keyed is None else self._is_stop(token_B) | (t + 1 >= keyed.cap_B)
      d = d._replace(step=t + 1, tokens_BxC=put(d.tokens_BxC, token_B),
                     mask_BxC=put(d.mask_BxC, active_B.astype(jnp.int32)), logp_BxC=put(d.logp_BxC, logp_B),
                     done_B=d.done_B | (active_B & ends_B))
      if routing:  # the experts of token t - 1, fed at this step
        d = d._replace(experts_BxCxLxk=jax.lax.dynamic_update_index_in_dim(
            d.experts_BxCxLxk, _stacked_experts(routing)[:, 0], t - 1, axis=1))
      return cache, d

    # Returning the cache lets XLA alias the donated input buffers to it, so the loop updates them in place
    # (with several segments, each later segment's loop updates its own padded copy in place).
    width, start = None, 1  # the prefill emitted token 0
    for end, S in decode_segments(P, C, cfg.decode_segment):
      if width is not None:
        cache = _split_batch(extend_cache(model.cfg, cache, S - width), mesh)
      cache, dec = segment_loop(cache, dec, start, end, S)
      width, start = S, end
    return cache, _replicate(dec, mesh)

  def _continuous_fn(self, state, prompt_cache, dec: _Decoding, prompt_mask_BxP, key, mesh, repeats, slots,
                     keyed: _Keyed | None = None):
    """Emits tokens 1..C-1 of every row on `slots` = S rows at a time: each slot decodes one row until it stops,
    then takes the next row not yet started (its prompt's cache copied from `prompt_cache`, R = B / G rows).
    Row b's token t is drawn from u[t, b] of the static decode's table, so the tokens are the static decode's."""
    self.trace_counts["decode"] += 1
    cfg = self.cfg
    model = nnx.merge(self.graphdef, cast_for_compute(state, nnx.merge(self.graphdef, state).cfg))
    B, P = prompt_mask_BxP.shape
    C, S, W = cfg.max_new_tokens, slots, cfg.max_new_tokens + prompt_mask_BxP.shape[1]
    prompt_len_B = jnp.sum(prompt_mask_BxP, axis=1).astype(jnp.int32)
    # the static decode's tables, read per slot
    u_CxB = jax.random.uniform(jax.random.fold_in(key, 1), (C, B)) if keyed is None else keyed.uniforms(C)
    rope_BxC = model.rope_tables(prompt_len_B[:, None] + jnp.arange(C)[None, :] - 1)
    key_ok_BxW = jnp.pad(prompt_mask_BxP.astype(bool), ((0, 0), (0, C)), constant_values=True)
    # The rows left to decode after the prefill's token, in (prompt, sample) order; a slot's row is B when idle.
    live_B = ~dec.done_B & (C > 1)
    queue_B = jnp.argsort(~live_B, stable=True).astype(jnp.int32)
    num_live = jnp.sum(live_B)
    cache = _split_batch(init_cache(model.cfg, S, W), mesh)
    slots0 = _Slots(row_S=_split_batch(jnp.full((S,), B, jnp.int32), mesh),
                    t_S=_split_batch(jnp.ones((S,), jnp.int32), mesh), started=jnp.zeros((), jnp.int32),
                    steps=jnp.zeros((), jnp.int32))

    def refill(cache, sl: _Slots):
      """Idle slots take the next rows of the queue, in slot order, and their prompts' caches."""
      idle_S = sl.row_S == B
      position_S = sl.started + jnp.cumsum(idle_S) - 1
      take_S = idle_S & (position_S < num_live)
      row_S = jnp.where(take_S, queue_B[jnp.minimum(position_S, B - 1)], sl.row_S)
      into_S = jnp.where(take_S, jnp.arange(S), S)  # S: out of range, dropped
      copy = lambda cache: jax.tree.map(
          lambda c, p: c.at[into_S].set(p[jnp.minimum(row_S, B - 1) // repeats], mode="drop"), cache, prompt_cache)
      # Skipped when no slot is idle: the copy touches S rows of the cache.
      cache = jax.lax.cond(jnp.any(take_S), copy, lambda cache: cache, cache)
      return cache, sl._replace(row_S=row_S, t_S=jnp.where(take_S, 1, sl.t_S), started=sl.started + jnp.sum(take_S))

    def step(_, carry):
      """Each busy slot s holding row b at token t: feeds token t - 1 at cache slot P + t - 1, emits token t."""
      cache, d, sl = carry
      busy_S = sl.row_S < B
      b_S, t_S = jnp.minimum(sl.row_S, B - 1), sl.t_S
      index_S = P + t_S - 1
      attn_Sx1xW = (key_ok_BxW[b_S] & (jnp.arange(W)[None] <= index_S[:, None]))[:, None, :]
      rope_t = jax.tree.map(lambda x: x[b_S, t_S][:, None], rope_BxC)
      hidden_Sx1xD, cache, routing = model(d.tokens_BxC[b_S, t_S - 1][:, None], None, attn_Sx1xW, cache, index_S,
                                           rope_cos_sin=rope_t, with_routing=True)
      token_S, logp_S = select_next_token(model.logits(hidden_Sx1xD)[:, 0], u_CxB[t_S, b_S], cfg)
      stop_S = self._is_stop(token_S)
      row_S = jnp.where(busy_S, sl.row_S, B)  # B: an idle slot's writes are dropped
      put = lambda buf_BxC, x_S: buf_BxC.at[row_S, t_S].set(x_S, mode="drop")
      d = d._replace(tokens_BxC=put(d.tokens_BxC, token_S), mask_BxC=put(d.mask_BxC, jnp.ones_like(token_S)),
                     logp_BxC=put(d.logp_BxC, logp_S),
                     done_B=d.done_B.at[jnp.where(stop_S, row_S, B)].set(True, mode="drop"))
      if routing:  # the experts of token t - 1, fed at this step
        d = d._replace(experts_BxCxLxk=d.experts_BxCxLxk.at[row_S, t_S - 1].set(
            _stacked_experts(routing)[:, 0], mode="drop"))
      last_S = t_S == C - 1 if keyed is None else t_S + 1 >= keyed.cap_B[b_S]
      ends_S = busy_S & (stop_S | last_S)
      return cache, d, sl._replace(row_S=jnp.where(ends_S, B, sl.row_S), t_S=jnp.where(ends_S, 1, t_S + busy_S),
                                   steps=sl.steps + 1)

    def chunk(carry):
      """Slots refilled, then `stop_check_every` token steps (a static trip count, as in `_decode_fn`): a slot
      whose row stops mid-chunk idles until the chunk ends."""
      cache, d, sl = carry
      cache, sl = refill(cache, sl)
      return jax.lax.fori_loop(0, self.stop_check_every, step, (cache, d, sl))

    busy = lambda carry: jnp.any(carry[2].row_S < B) | (carry[2].started < num_live)
    cache, dec, sl = jax.lax.while_loop(busy, chunk, (cache, dec, slots0))
    return cache, _replicate(dec, mesh), sl.steps

  def _is_stop(self, token_B):
    stop = jnp.zeros(token_B.shape, bool)
    for s in self.cfg.stop_ids:
      stop = stop | (token_B == s)
    return stop

  # ---- host side ----

  def shapes_for(self, num_prompts: int, longest_prompt: int, batch_ways: int = 1,
                 beyond_widths: bool = False) -> tuple[int, int]:
    """(prompt-row bucket, prompt-length bucket) that `generate` compiles for; the row bucket is a multiple of
    `batch_ways`, the number of devices the batch is split over. `beyond_widths`: a prompt longer than the widest
    `prompt_widths` takes the length buckets (a prompt plus its prefix, which the update never sees as a prompt)."""
    rows = bucket_size(num_prompts, 1, self.batch_bucket_step)
    rows = -(-rows // batch_ways) * batch_ways
    fits = [w for w in self.prompt_widths or () if w >= longest_prompt]
    if self.prompt_widths is None or not fits and beyond_widths:
      return rows, bucket_size(longest_prompt, self.prompt_bucket_min, self.prompt_bucket_step)
    if not fits:
      raise ValueError(f"Sampler.generate: a prompt of {longest_prompt} tokens is longer than the widest prompt "
                       f"width {self.prompt_widths[-1]}")
    return rows, fits[0]

  def _check_prompts(self, state, prompts):
    if self._vocab_size is None:
      self._vocab_size = nnx.merge(self.graphdef, state).cfg.vocab_size
    if not prompts:
      raise ValueError("Sampler.generate: prompts is empty")
    V = self._vocab_size
    for i, p in enumerate(prompts):
      if len(p) == 0:
        raise ValueError(f"Sampler.generate: prompt {i} is empty")
      lo, hi = min(p), max(p)
      if lo < 0 or hi >= V:
        raise ValueError(f"Sampler.generate: prompt {i} has token id {lo if lo < 0 else hi} outside "
                         f"[0, vocab_size={V})")

  def _keyed(self, row_keys, prefixes, budget, prompts, repeats, num_rows) -> tuple[np.ndarray, ...]:
    """The keyed rows' (key data, start, cap) for the batch's b rows, checked."""
    b, C = len(prompts) * repeats, self.cfg.max_new_tokens
    if row_keys is None:
      if prefixes is not None or budget is not None:
        raise ValueError("Sampler.generate: prefixes and budget need row_keys (a continued row draws its tokens "
                         "from its own key)")
      return None
    if isinstance(row_keys, jax.Array) and jax.dtypes.issubdtype(row_keys.dtype, jax.dtypes.prng_key):
      row_keys = jax.random.key_data(row_keys)
    key_data = np.asarray(row_keys).astype(np.uint32)
    want = jax.random.key_data(jax.random.key(0)).shape
    if key_data.shape != (b, *want):
      raise ValueError(f"Sampler.generate: row_keys has shape {key_data.shape[:1]} (key data {key_data.shape}); "
                       f"expected one key of the default PRNG per row: {b} = len(prompts) x repeats")
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 1):
      raise ValueError(f"Sampler.generate: budget={budget!r} must be an int >= 1")
    start = np.zeros(b, np.int32)
    if prefixes is not None:
      if repeats > 1:
        raise ValueError(f"Sampler.generate: prefixes cannot be combined with repeats={repeats} (a group's prefill "
                         f"is shared, a prefix is one row's): give each row its prompt, repeats=1")
      if len(prefixes) != b:
        raise ValueError(f"Sampler.generate: {len(prefixes)} prefixes for {b} prompts")
      for i, q in enumerate(prefixes):
        if len(q) >= C or set(q) & set(self.cfg.stop_ids):
          raise ValueError(f"Sampler.generate: prefix {i} ({len(q)} tokens) has nothing to continue: it is "
                           f"max_new_tokens={C} long or holds a stop id")
        if q and (min(q) < 0 or max(q) >= self._vocab_size):
          raise ValueError(f"Sampler.generate: prefix {i} has a token id outside [0, vocab_size={self._vocab_size})")
      start[:] = [len(q) for q in prefixes]
    cap = np.minimum(C - start, budget or C)
    pad = lambda x, fill: np.concatenate([x, np.full((num_rows - b, *x.shape[1:]), fill, x.dtype)])
    return pad(key_data, 0), pad(start, 0), pad(cap, 1)

  def generate(self, state, prompts: list[list[int]], key: jax.Array, repeats: int = 1, *, row_keys=None,
               prefixes: list[list[int]] | None = None, budget: int | None = None) -> SampleResult:
    """Samples `repeats` completions of each prompt: rows r * repeats .. r * repeats + repeats - 1 continue
    prompts[r] (a GRPO group: repeats = G, one prefill per prompt).

    Keyed rows (see the module docstring): `row_keys` ([B] jax keys, B = len(prompts) x repeats) replaces `key`:
    row b's completion token j draws uniform(fold_in(row_keys[b], j)). `prefixes` (with repeats=1): row b's
    completion tokens so far, fed after its prompt; its new tokens continue at index len(prefixes[b]) up to
    max_new_tokens in all. `budget`: at most this many new tokens per row (the rest come back unfinished)."""
    if not isinstance(repeats, int) or repeats < 1:
      raise ValueError(f"Sampler.generate: repeats={repeats!r} must be an int >= 1")
    prompts = [list(map(int, p)) for p in prompts]
    self._check_prompts(state, prompts)
    prefixes = None if prefixes is None else [list(map(int, q)) for q in prefixes]
    mesh = self.mesh if self.mesh is not None else state_mesh(state)
    ways = 1 if mesh is None else math.prod(mesh.shape[a] for a in batch_axes(mesh))
    rows, P = self.shapes_for(len(prompts), max(len(p) for p in prompts), ways)
    slots = min(self.cfg.slots, rows * repeats)  # more slots than rows would idle
    if slots % ways:
      raise ValueError(f"Sampler.generate: sampling.slots={self.cfg.slots} must be a multiple of the {ways} devices "
                       f"the batch is split over (mesh axes {'/'.join(batch_axes(mesh))}): set it to one")
    keyed = self._keyed(row_keys, prefixes, budget, prompts, repeats, rows * repeats)
    prompt_RxP, prompt_mask_RxP = left_pad(prompts, P, rows, self.cfg.pad_id)
    # The prefill's prompts: with prefixes, each prompt followed by its prefix (a KV cache is never kept across
    # calls: a continued row's context is prefilled again, possibly with other weights).
    context_RxW, context_mask_RxW = prompt_RxP, prompt_mask_RxP
    if prefixes:
      contexts = [p + q for p, q in zip(prompts, prefixes)]
      W = self.shapes_for(len(prompts), max(map(len, contexts)), ways, beyond_widths=True)[1]
      context_RxW, context_mask_RxW = left_pad(contexts, W, rows, self.cfg.pad_id)
    context_mask_BxW = np.repeat(context_mask_RxW, repeats, axis=0)
    b = len(prompts) * repeats
    row_valid_B = np.arange(rows * repeats) < b
    inputs = (context_RxW, context_mask_RxW, row_valid_B, context_mask_BxW, *(keyed or ()))
    if mesh is not None:
      # Every process holds the whole batch: each device takes its rows (works across processes too).
      split = NamedSharding(mesh, PartitionSpec(batch_axes(mesh)))
      inputs = tuple(jax.make_array_from_callback(x.shape, split, lambda idx, x=x: x[idx]) for x in inputs)
    keyed = None if keyed is None else _Keyed(*inputs[4:])
    if keyed is not None and key is None:
      key = jax.random.key(0)  # unused: the programs take it either way
    cache, dec = self._prefill(state, *inputs[:3], key, self._prompt_rope(state, inputs[1]), mesh=mesh,
                               repeats=repeats, keep_prompts=bool(slots), keyed=keyed)
    if slots:
      cache, dec, steps = self._continuous(state, cache, dec, inputs[3], key, mesh=mesh, repeats=repeats,
                                           slots=slots, keyed=keyed)
      steps = int(steps)
    else:
      cache, dec = self._decode(state, cache, dec, inputs[3], key, mesh=mesh, keyed=keyed)
      steps = int(dec.step) - 1
    # how the last call split the cache over devices (the first leaf: a KV cache's keys or a linear layer's window)
    self.last_cache_sharding = jax.tree.leaves(cache)[0].sharding
    del cache
    self.last_num_steps = steps + 1  # the prefill's token step and the decode's
    all_mask = np.asarray(dec.mask_BxC)
    self.slot_steps += (slots or rows * repeats) * steps
    self.kept_slot_steps += int(all_mask[:, 1:].sum())
    mask = all_mask[:b]
    tokens, logp = np.asarray(dec.tokens_BxC)[:b], np.asarray(dec.logp_BxC)[:b]
    experts = None if dec.experts_BxCxLxk is None or prefixes else np.concatenate(
        [np.asarray(dec.prompt_experts_BxPxLxk)[:b], np.asarray(dec.experts_BxCxLxk)[:b]], axis=1)
    prompt_BxP, prompt_mask_BxP = np.repeat(prompt_RxP[:len(prompts)], repeats, axis=0), context_mask_BxW[:b]
    if keyed is None:
      return SampleResult(
          prompt_BxP=prompt_BxP, prompt_mask_BxP=prompt_mask_BxP, completion_BxC=tokens, completion_mask_BxC=mask,
          logp_BxC=logp, lengths_B=mask.sum(axis=1).astype(np.int32), truncated_B=~np.asarray(dec.done_B)[:b],
          experts_BxTxLxk=experts)
    return self._keyed_result(prompt_BxP, np.repeat(prompt_mask_RxP[:len(prompts)], repeats, axis=0), prefixes,
                              tokens, mask, logp, experts)

  def _keyed_result(self, prompt_BxP, prompt_mask_BxP, prefixes, new_BxC, new_mask_BxC, new_logp_BxC, experts):
    """The keyed rows' SampleResult: each row's prefix then its new tokens (decoded from column 0 of the
    decode's buffers), which the caller appends to what it holds."""
    B, C = new_BxC.shape
    start_B = np.array([len(q) for q in prefixes] if prefixes else [0] * B, np.int32)
    new_B = new_mask_BxC.sum(axis=1).astype(np.int32)
    lengths_B = start_B + new_B
    # Column c of the whole completion is the decode's column c - start; the prefix fills the columns before.
    source_BxC = np.arange(C)[None] - start_B[:, None]
    is_new_BxC = (source_BxC >= 0) & (source_BxC < new_B[:, None])
    take = lambda x_BxC, fill: np.where(is_new_BxC, np.take_along_axis(x_BxC, np.clip(source_BxC, 0, C - 1), 1), fill)
    completion_BxC = take(new_BxC, self.cfg.pad_id)
    for i, q in enumerate(prefixes or ()):
      completion_BxC[i, :len(q)] = q
    last_B = new_BxC[np.arange(B), np.maximum(new_B - 1, 0)]
    stopped_B = (new_B > 0) & np.isin(last_B, self.cfg.stop_ids)
    truncated_B = ~stopped_B & (lengths_B == C)
    return SampleResult(
        prompt_BxP=prompt_BxP, prompt_mask_BxP=prompt_mask_BxP, completion_BxC=completion_BxC.astype(np.int32),
        completion_mask_BxC=(np.arange(C)[None] < lengths_B[:, None]).astype(np.int32),
        logp_BxC=take(new_logp_BxC, 0.0).astype(np.float32), lengths_B=lengths_B, truncated_B=truncated_B,
        experts_BxTxLxk=experts, start_B=start_B, unfinished_B=~stopped_B & ~truncated_B)

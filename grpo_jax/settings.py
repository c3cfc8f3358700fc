"""Every setting of a grpo_jax run, its default and its meaning, written once: one frozen dataclass per config
section, under the root `Settings`, each checking its own values.

The user's interface stays the ml_collections ConfigDict (experiment files, presets, `--config.X` flags): the base
ConfigDict is generated from these classes (`grpo_jax.config.get_config`), and the comment beside each field is
its documentation (scripts/config_reference.py writes docs/config.md from it). A comment continues on the lines
under it that start at column 20 or later; a field without a comment of its own is documented by the comment block
right above it.

Units: a "step" is one GRPO iteration (sample a rollout batch, then `num_iterations` passes of mini-batch
updates over it). An "update" is one optimizer step. Batch sizes count completions unless they say prompts.

`Settings.from_config(config)` builds the frozen tree once, at the top (grpo_jax/train/checks.py: `validate`); a
bad value stops it with `config.<key>=<value>: <what is allowed>` (grpo_jax/config_checks.py). Names taken from a
registry of a layer above (losses, advantages, rewards, tasks, environments) and values that need the disk
(hf_path, init_checkpoint) are checked by their owners' `validate_config`. What the settings imply (batch sizes,
widths, the weighted rewards) are properties of the root, each computed where read from the fields.
"""
from __future__ import annotations

import dataclasses
import math
import typing
from typing import Optional

from grpo_jax.config_checks import Section, fail

SCHEDULES = ("constant", "cosine")            # optim.schedule
IMPORTANCE_LEVELS = ("token", "sequence")     # grpo.importance_level
DISTRIBUTED = ("auto", "yes", "no")           # distributed.enabled


def _map(**defaults):
  """A name -> value map (rewards, reward gates, a dataset's options), set whole rather than key by key."""
  return dataclasses.field(default_factory=lambda: dict(defaults))


def task_key(default, does: str):
  """A config.task key read only by the tasks that name it in their `takes` (grpo_jax/data/tasks.py); `does` ends
  the error any other task gets: "only reasoning_gym tasks <does>, not 'addition'"."""
  if isinstance(default, dict):
    return dataclasses.field(default_factory=lambda: dict(default), metadata={"does": does})
  return dataclasses.field(default=default, metadata={"does": does})


def _section(cls):
  return dataclasses.field(default_factory=cls)


def resumable(default):
  """A field a resumed run may change (config.resumable_keys): when to stop, what to log, how often to save or
  evaluate, what an evaluation samples, how the same computation is laid out; any other change would make the
  resumed run a different experiment. A section whose every field may change says so with `RESUMABLE = True`."""
  return dataclasses.field(default=default, metadata={"resumable": True})


@dataclasses.dataclass(frozen=True)
class ModelSettings:
  """The model: a Hugging Face checkpoint, or a fresh one of the shape below."""
  hf_path: str = ""               # directory with a Hugging Face checkpoint (config.json + safetensors +
                                  # tokenizer); "" builds a fresh model from the fields below.
  vocab_size: int = 0             # 0: the tokenizer's vocabulary size.
  hidden_size: int = 64           # a fresh model's shape (ignored with hf_path): width D,
  intermediate_size: int = 256    # MLP hidden size F,
  num_layers: int = 2             # decoder layers,
  num_heads: int = 4              # query heads,
  num_kv_heads: int = 4           # key/value heads (grouped-query attention when fewer),
  head_dim: int = 16              # and the dimension of a head.
  max_position_embeddings: int = 32  # the context: max_prompt_length + max_new_tokens must fit in it.
  rope_theta: float = 10000.0     # RoPE base of a fresh model.
  rms_norm_eps: float = 1e-6      # RMSNorm epsilon of a fresh model.
  tie_word_embeddings: bool = False  # a fresh model reuses the embedding as the output projection.
  param_dtype: str = "float32"    # dtype of the parameters and optimizer state ("float32", "bfloat16").
  dtype: str = "float32"          # compute dtype of activations (also used for HF checkpoints when set).
  remat: bool = False             # rematerialize decoder layers in the backward pass (saves memory).
  attention: str = "einsum"       # the update's attention: "einsum", "jax" (jax.nn.dot_product_attention, XLA)
                                  # or "cudnn" (its cuDNN flash attention; NVIDIA GPUs, bfloat16 compute).
  decode_attention: str = "einsum"  # the sampler's token steps: "einsum" (XLA) or "pallas" (one kernel per layer
                                  # over the filled cache slots; NVIDIA GPUs, or the CPU's slow interpreter).
  share_prompt_forward: bool = resumable(True)  # the update and the reference run each prompt once for its G rows
                                  # (where micro-batches hold whole groups, or parts of one): fewer FLOPs, same values.
  logprob_chunk_size: int = 128   # sequence chunk for log-probs: [B, chunk, V] logits at a time, never [B,T,V].
  offload_ref_params: bool = resumable(False)  # keep the reference parameters in pinned host memory between uses (a
                                  # no-op, logged, where the backend has none); saves one model copy per device.
  # LoRA (grpo_jax/model/lora.py): train low-rank adapters W + (alpha / rank) B A on the chosen projections, the
  # base weights frozen; with beta > 0 the reference is the base model (adapters off), no second copy.
  lora_rank: int = 0              # 0: full fine-tuning.
  lora_alpha: float = 32.0        # the update's scale is lora_alpha / lora_rank.
  lora_targets: str = "all"       # "all" or comma-separated: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj,
                                  # down_proj (Hugging Face / peft names).

  def __post_init__(self):
    # attention, dtypes, hf_path and lora_targets: grpo_jax/model/config.py and lora.py (their names, the disk).
    s = Section(self, "model")
    s.at_least(0, "vocab_size", "lora_rank")
    s.at_least(1, "logprob_chunk_size")
    if not self.hf_path:
      s.at_least(1, "num_heads", "num_kv_heads")
      if self.num_heads % self.num_kv_heads:
        s.fail("num_kv_heads", f"does not divide num_heads={self.num_heads}")


@dataclasses.dataclass(frozen=True)
class MoeSettings:
  """Mixtures of experts (grpo_jax/model/moe.py): a fresh model's expert layers, and how every MoE model (fresh or a
  Qwen3-MoE / gpt-oss checkpoint) computes them."""
  num_experts: int = 0            # a fresh model's experts per layer (ignored with hf_path); 0: dense MLPs.
  experts_per_token: int = 2      # k: experts each token reaches (a fresh model's).
  intermediate_size: int = 0      # one expert's hidden size (a fresh model's); 0: model.intermediate_size.
  router: str = "softmax_topk"    # "softmax_topk": softmax over all experts, then the top k (Qwen3-MoE);
                                  # "topk_softmax": softmax over the k largest logits (gpt-oss). A fresh model's.
  norm_topk_prob: bool = True     # softmax_topk: the k weights renormalized to sum 1 (a fresh model's).
  impl: str = "auto"              # dropless, tokens sorted by expert: "ragged" (jax.lax.ragged_dot), "blocks" (per-
                                  # expert blocks, one batched matmul), "auto" (blocks on CPUs, ragged elsewhere);
                                  # "dense": every expert on every token (the reference; E / k times the FLOPs).
  aux_loss_coef: float = 0.0      # weight of the load-balancing loss (Switch Transformer's; logged: moe/aux_loss).
  z_loss_coef: float = 0.0        # weight of the router z-loss (ST-MoE's; logged: moe/z_loss).
  routing_replay: bool = False    # the update's log-probs use the experts the sampler chose for each token (the
                                  # router still learns through their weights); moe/routing_flip is logged either way.

  def __post_init__(self):
    s = Section(self, "moe")
    s.at_least(0, "num_experts", "intermediate_size", "aux_loss_coef", "z_loss_coef")
    s.one_of("impl", ("auto", "ragged", "blocks", "dense"))
    s.one_of("router", ("softmax_topk", "topk_softmax"))
    if self.num_experts:
      s.at_least(1, "experts_per_token")
      if self.experts_per_token > self.num_experts:
        s.fail("experts_per_token", f"exceeds num_experts={self.num_experts}")


@dataclasses.dataclass(frozen=True)
class EnvSettings:
  """Multi-turn episodes (grpo_jax/envs, grpo_jax/sampling/episodes.py). With `name` set, each completion is an
  episode: the policy's messages (each at most sampling.max_new_tokens) alternate with the environment's
  observations, which are context but never trained on. The rewards grade the last message; GRPO's advantage is
  the whole episode's."""
  name: str = ""                  # the environment (grpo_jax/envs), or "package.module:Class"; "": single turn.
  max_turns: int = 3              # messages per episode, at most.
  max_episode_tokens: int = 48    # the episode's width after the prompt: messages and observations.
  max_observation_tokens: int = 16  # an observation's tokens, at most (longer ones are cut).
  step_timeout_s: float = resumable(10.0)  # a reset/step that raises or takes longer ends its episode
                                  # (episodes/env_failures).
  max_concurrent_steps: int = resumable(64)  # the episodes' reset/step calls of a turn run in threads, this many at
                                  # once.

  def __post_init__(self):
    if self.name:  # single turn reads none of them; the name itself: grpo_jax/envs
      s = Section(self, "env")
      s.at_least(1, "max_turns", "max_episode_tokens", "max_observation_tokens", "max_concurrent_steps")
      s.positive("step_timeout_s")


# jax's matmul precisions (grpo_jax/precision.py), here: that module imports jax, which the sweep driver does not.
MATMUL_PRECISIONS = ("default", "high", "highest")


@dataclasses.dataclass(frozen=True)
class PrecisionSettings:
  """Numerics (grpo_jax/precision.py)."""
  matmul: str = "default"         # float32 matmuls: "default" (TF32 on NVIDIA GPUs, bf16 on TPUs, f32 on CPUs),
                                  # "high", "highest" (full float32 everywhere).
  deterministic: bool = False     # XLA's deterministic GPU ops (bitwise-exact resume on GPUs; slower).

  def __post_init__(self):
    Section(self, "precision").one_of("matmul", MATMUL_PRECISIONS)


@dataclasses.dataclass(frozen=True)
class MeshSettings:
  """Devices: the axes of the device mesh (grpo_jax/model/sharding.py)."""
  RESUMABLE: typing.ClassVar[bool] = True  # the same run laid out or logged otherwise
  data: int = -1                  # data-parallel axis size; -1: all devices not used by the other axes.
  fsdp: int = 1                   # parameters, gradients and optimizer state sharded along 'embed'.
  tensor: int = 1                 # tensor parallelism over heads / MLP units / vocabulary.
  expert: int = 1                 # mixtures of experts: expert weights split by expert (and the batch) over it.

  def __post_init__(self):
    # make_mesh checks the sizes against the devices at start-up.
    s = Section(self, "mesh")
    s.at_least(1, "fsdp", "tensor", "expert")
    if self.data != -1:
      s.at_least(1, "data", why=" (or -1: the devices fsdp * tensor * expert leave)")


@dataclasses.dataclass(frozen=True)
class DistributedSettings:
  """Multi-host (jax.distributed; docs/scaling.md). "" / 0 / -1: detected from the environment."""
  RESUMABLE: typing.ClassVar[bool] = True  # the same run laid out or logged otherwise
  enabled: str = "auto"           # "auto": when coordinator_address or a cluster environment is set; "yes", "no".
  coordinator_address: str = ""   # "host:port" of process 0.
  num_processes: int = 0          # processes of the run (0: from the environment).
  process_id: int = -1            # this process's index (-1: from the environment).
  local_device_ids: str = ""      # e.g. "0,1": the devices this process uses ("": all visible).

  def __post_init__(self):
    Section(self, "distributed").one_of("enabled", DISTRIBUTED)


@dataclasses.dataclass(frozen=True)
class TaskSettings:
  """The task the prompts come from (grpo_jax/data/tasks.py); each task reads the keys it names."""
  name: str = "addition"          # the task the prompts come from (grpo_jax/data/tasks.py).
  num_digits: int = 2             # addition: operands have 1..num_digits digits; word_arithmetic: exactly.
  min_terms: int = 3              # chain_sum: each prompt sums min_terms..max_terms single digits;
  max_terms: int = 8              # chain_sum: most terms of a chain.
  scratchpad_fraction: float = 0.5  # chain_sum: the warm start's share of written-out (running-sum) answers.
  tool_fraction: float = 0.5      # tool_arithmetic: the warm start's share of episodes that call the calculator.
  heldout_fraction: float = 0.1   # fraction of all problems (addition) or train rows (dataset without
                                  # heldout_path) reserved for evaluation, never trained on.
  # dataset (grpo_jax/data/datasets.py): local JSONL / Parquet / .arrow / save_to_disk; GSM8K, MATH and
  # Countdown layouts are recognized, other columns need field_map. Needs model.hf_path (its tokenizer).
  train_path: str = ""            # dataset: the training file or directory.
  train_split: str = "train"      # the split of a DatasetDict directory.
  heldout_path: str = ""          # "": hold out heldout_fraction of the train rows.
  heldout_split: str = "test"     # dataset: the split of a save_to_disk DatasetDict used as held-out.
  field_map: dict = _map()        # canonical field -> column, e.g. {"prompt": "q", "answer": "a"}.
  max_rows: int = 0               # read at most this many rows of each file; 0: all.
  template: str = "plain"         # grpo_jax/data/templates.py's TEMPLATES; "chat": the tokenizer's template.
  system_prompt: str = ""         # chat template: the system message ("": none).
  answer_only: bool = task_key(False, "have an answer-only mode")  # reasoning_gym: prompt ends in "<answer>",
                                  # completion stops at "</".
  prefill_think: bool = False     # end the prompt with "<think>" (score with the format_*_prefilled rewards).
  # word_arithmetic (grpo_jax/data/word_arithmetic.py): sums asked in English, chat template, needs hf_path.
  # reasoning_gym:<dataset> (grpo_jax/data/reasoning_gym.py, pip install -e '.[gym]'): any reasoning-gym
  # dataset, its items rendered like dataset rows (template, system_prompt), needs hf_path; reward "reasoning_gym".
  options: dict = task_key({}, "take options")  # the dataset's own options, e.g. {"min_animals": 2}; composite:
                                  # {"datasets": {"leg_counting": {"weight": 2.0, "config": {...}}, ...}}.
  train_size: int = 10000         # training items: 0 .. train_size-1 of the dataset seeded train_seed ...
  train_seed: int = 1             # reasoning_gym: the training items' seed.
  heldout_size: int = 500         # ... held-out items: of the one seeded heldout_seed (eval.size of them are
  heldout_seed: int = 1_000_000   # evaluated), minus any whose question is a training question (counted).
  transfer: str = task_key("", "have transfer sets")  # word_arithmetic: further held-out sets, never trained
                                  # on, comma-separated ("three_digit,reworded"), evaluated at steps 0 and num_steps as
                                  # transfer/<name>/accuracy ...; "": none.


@dataclasses.dataclass(frozen=True)
class SamplingSettings:
  """Sampling of the rollouts (grpo_jax/sampling)."""
  max_prompt_length: int = 8      # prompts are left-padded to this (one compiled shape), in tokens; longer
                                  # ones are an error (addition) or dropped and counted (dataset).
  max_new_tokens: int = 4         # completion length limit (C_max, the papers' L_max); the stop token counts.
  temperature: float = 1.0        # sampling temperature; the loss uses log-probs at the same temperature.
  top_k: int = 0                  # 0: off.
  top_p: float = 1.0              # 1.0: off.
  decode_segment: int = 0         # >0: decode in segments of this many token steps, each attending only to the
                                  # cache slots filled by its end: fewer KV-cache bytes read per token step (an
                                  # accelerator's decode is bound by them), the same tokens; the cache is copied
                                  # once per segment (briefly twice its size). 0: one loop over the whole cache.
  slots: int = 0                  # >0: continuous batching: the decode runs this many rows at once and a row that
                                  # stops hands its slot to the next (prompt, sample) not yet started; the same
                                  # completions, fewer token steps when lengths vary (long tails). 0: every row of
                                  # the batch decodes until the last one stops.

  def __post_init__(self):
    s = Section(self, "sampling")
    s.at_least(1, "max_prompt_length")
    check_sampling(s)


def check_sampling(s: Section) -> None:
  """The ranges of the sampler's knobs, in one place for a run's `sampling` section and a notebook's
  SamplingConfig (grpo_jax/sampling/config.py), which has the same fields."""
  s.at_least(1, "max_new_tokens")
  s.positive("temperature")
  s.at_least(0, "top_k", "decode_segment", "slots")
  s.within("top_p", 0, 1, open_low=True)
  if s["slots"] and s["decode_segment"]:
    s.fail("slots", f"cannot be combined with {s.key('decode_segment')}={s['decode_segment']} (segments need every "
           "row at one token step, slots hold rows at different ones): set one of them to 0")


@dataclasses.dataclass(frozen=True)
class GrpoSettings:
  """GRPO: batch sizes, advantages and the loss (semantics: docs/algorithms.md)."""
  group_size: int = 8             # G completions per prompt.
  prompts_per_step: int = 32      # prompts per rollout batch; rollout batch = prompts_per_step * group_size.
  num_iterations: int = 1         # mu: passes over each rollout batch.
  mini_batch_size: int = 0        # completions per optimizer update; 0: the whole rollout batch.
  micro_batch_size: int = resumable(0)  # completions per forward/backward (gradient accumulation); 0: mini-batch.
  advantage: str = "grpo"         # how a group's rewards become advantages (grpo_jax/algo/advantages.py).
  std_ddof: int = 1               # 0 or 1: ddof of the group std (TRL/Tunix: 1; population std: 0).
  advantage_eps: float = 1e-4     # added to the std before dividing.
  policy_loss: str = "clipped"    # the policy term (grpo_jax/algo/policy_losses.py, or your own: register_loss).
  epsilon_low: float = 0.2        # clip range below: the ratio is clipped at 1 - epsilon_low.
  epsilon_high: Optional[float] = None  # None: = epsilon_low (DAPO clip-higher: 0.28).
  delta: Optional[float] = None   # dual-clip cap on the ratio for negative advantages.
  importance_level: str = "token"  # "sequence": GSPO (use small epsilons, e.g. 3e-4 / 4e-4).
  cispo_epsilon_high: float = 5.0  # CISPO's upper truncation of the importance weight.
  kl_estimator: str = "k3"        # the per-token KL estimator (grpo_jax/algo/kl.py).
  beta: float = 0.04              # KL weight (DeepSeekMath 0.04); 0 skips the reference model entirely.
  entropy_coef: float = 0.0       # adds -entropy_coef * H per token (negative: an entropy penalty).
  top_entropy_quantile: Optional[float] = None  # e.g. 0.2: gradient only on the top 20% entropy.
  aggregation: str = "seq_mean_token_mean"  # per-token losses to one scalar (grpo_jax/algo/aggregation.py).
  tis_cap: float = 0.0            # truncated importance sampling: weight each token's policy term by
                                  # min(pi_old / pi_sampler, tis_cap) (TRL's default cap: 2); 0: off.
  correction: str = "proximal"    # the ratio of a batch an older policy sampled (rollout.staleness > 0), against:
                                  # "proximal", the policy at the update's start (with tis_cap: AReaL's
                                  # decoupled objective), or "behaviour", the sampler's (naive PPO);
                                  # grpo_jax/algo/corrections.py.
  ref_reset_every: int = 0        # reset the reference policy to the current one every N steps; 0: never.
  mask_truncated_completions: bool = False  # DAPO: completions that hit max_new_tokens get no loss.
  overlong_buffer: int = 0        # DAPO soft overlong penalty over the last N tokens of max_new_tokens; 0: off.
  overlong_penalty_factor: float = 1.0  # DAPO: the overlong penalty at max_new_tokens (scales overlong_buffer's ramp).
  length_buckets: int = resumable(4)  # the update runs on prompts and completions cut to the smallest of 4 widths (1/4,
                                  # 2/4, 3/4, 4/4 of max_prompt_length / max_new_tokens, multiples of 8) that holds the
                                  # batch's longest: short answers cost less (one compiled program per width used); 1:
                                  # always the full widths (one program).
  dynamic_sampling: bool = False  # DAPO dynamic sampling: drop groups whose rewards are all equal and sample
                                  # more prompts (same shapes, no recompile) until the batch has prompts_per_step
                                  # groups with signal ...
  dynamic_sampling_max_rounds: int = 4  # ... or this many sampler calls per step were made; a batch still short
                                  # is filled with zero-std groups (zero advantage: no policy gradient).

  def __post_init__(self):
    # The names (advantage, policy_loss, kl_estimator, aggregation): their registries in grpo_jax/algo.
    s = Section(self, "grpo")
    s.at_least(2, "group_size", why=" (advantages are relative within a group)")
    s.at_least(1, "prompts_per_step", "num_iterations", "dynamic_sampling_max_rounds", "length_buckets")
    s.at_least(0, "mini_batch_size", "micro_batch_size", "ref_reset_every", "overlong_buffer")
    s.one_of("std_ddof", (0, 1))
    s.positive("advantage_eps")
    check_objective(s)


def check_objective(s: Section) -> None:
  """The ranges of the objective's knobs, in one place for a run's `grpo` section (GrpoSettings) and a notebook's
  LossConfig (grpo_jax/algo/objective.py), which has the same fields; their names are checked by the registries."""
  s.within("epsilon_low", 0, 1, open_high=True)
  if s["epsilon_high"] is not None:
    s.at_least(0, "epsilon_high", why=" or None")
  if s["delta"] is not None and not s["delta"] > 1:
    s.fail("delta", "the dual-clip cap must be > 1 (e.g. 3) or None")
  s.one_of("importance_level", IMPORTANCE_LEVELS)
  s.positive("cispo_epsilon_high")
  s.at_least(0, "beta")
  if not math.isfinite(s["entropy_coef"]):
    s.fail("entropy_coef", "must be a finite number (negative: an entropy penalty)")
  s.within("top_entropy_quantile", 0, 1, open_low=True, or_none=True)
  if s["tis_cap"] is not None:
    s.at_least(0, "tis_cap", why=" (0 or None: off)")
  if s["correction"] == "behaviour" and s["tis_cap"]:
    s.fail("tis_cap", "weights by pi_proximal / pi_behaviour, which is 1 with correction='behaviour': set it to 0 "
           "there")


@dataclasses.dataclass(frozen=True)
class RolloutSettings:
  """Rollouts ahead of the update (the `rollout` section): the sampler as a producer of batches."""
  staleness: int = 0              # k: update t learns from the batch the policy of k updates earlier sampled (the
                                  # first steps from the starting policy); 0: sample, then update. Batch t always
                                  # uses step t's key and prompts, whoever samples it and whenever.

  sampler_devices: int = resumable(0)  # N > 0: the sampler runs on the last N devices, concurrently with the
                                  # update on the others (mesh.data = -1 then counts the trainer's), and the
                                  # trainable weights move there after each update; needs staleness >= 1. 0: one
                                  # set of devices. One process only. The same batches either way.
  sampler_tensor: int = resumable(1)  # the sampler's own layout of its N devices: N / T data-parallel groups that
                                  # each hold the weights split over T devices by heads and MLP units (the
                                  # trainer's fsdp does not apply); must divide N.
  decode_budget: int = 0          # B > 0: rollouts that span updates: a batch in flight is decoded B new tokens
                                  # per policy, continued under each newer one (token i by the policy after
                                  # min(p0 + i // B, t - 1) updates, p0 that of its first token); needs staleness
                                  # >= 1. 0: each batch by one policy.

  def __post_init__(self):
    s = Section(self, "rollout")
    s.at_least(0, "staleness", "sampler_devices", "decode_budget")
    s.at_least(1, "sampler_tensor")
    if self.decode_budget and not self.staleness:
      s.fail("decode_budget", "needs rollout.staleness >= 1 (a batch's tokens span the updates between its start "
             "and its own update; at staleness 0 there are none): set staleness or decode_budget = 0")
    if self.sampler_devices and not self.staleness:
      s.fail("sampler_devices", "needs rollout.staleness >= 1 (the sampler works on the batch of a later step "
             "while the update runs)")
    if self.sampler_devices % self.sampler_tensor:
      s.fail("sampler_tensor", f"does not divide rollout.sampler_devices={self.sampler_devices}: set it to a "
             "divisor")


@dataclasses.dataclass(frozen=True)
class OptimSettings:
  """The optimizer (Optax; grpo_jax/train/optim.py): global-norm clipping, then AdamW under a schedule."""
  learning_rate: float = 3e-4     # peak learning rate.
  schedule: str = "constant"      # "constant" or "cosine" (decays to min_lr_ratio * peak at num_steps).
  warmup_steps: int = 0           # linear warmup over this many GRPO steps.
  min_lr_ratio: float = 0.0       # cosine schedule: the final learning rate as a fraction of learning_rate.
  b1: float = 0.9                 # AdamW first-moment decay.
  b2: float = 0.999               # AdamW second-moment decay.
  eps: float = 1e-8               # AdamW epsilon.
  weight_decay: float = 0.0       # AdamW decoupled weight decay.
  grad_clip_norm: float = 1.0     # global-norm clipping; 0: off.

  def __post_init__(self):
    s = Section(self, "optim")
    s.positive("learning_rate")
    s.one_of("schedule", SCHEDULES)
    s.at_least(0, "warmup_steps", "weight_decay", "grad_clip_norm")
    s.within("min_lr_ratio", 0, 1)


@dataclasses.dataclass(frozen=True)
class WarmstartSettings:
  """Supervised warm start (teacher-forced cross-entropy on gold answers; grpo_jax/train/warmstart.py)."""
  enabled: bool = False           # a supervised warm start on the gold answers before GRPO.
  learning_rate: float = 3e-3     # its Adam learning rate,
  batch_size: int = 128           # its batch size,
  max_steps: int = 2000           # and its step limit (it stops earlier at target_accuracy).
  eval_every: int = 25            # held-out greedy accuracy is measured every N warm-start steps ...
  target_accuracy: float = 0.3    # ... and warm start stops at the first evaluation reaching this.
  init_checkpoint: str = ""       # instead of warm-starting: another run's workdir, whose starting point (its
                                  # warmstart/ directory, else checkpoints/0) this run starts GRPO from:
                                  # parameters, data position and step-0 evaluation (sweeps share one warm start).

  def __post_init__(self):
    # init_checkpoint, a directory: grpo_jax/train/warmstart.py.
    s = Section(self, "warmstart")
    s.positive("learning_rate")
    s.at_least(1, "batch_size", "max_steps", "eval_every")


@dataclasses.dataclass(frozen=True)
class EvalSettings:
  """Evaluation on held-out prompts (grpo_jax/train/evaluation.py)."""
  every: int = resumable(50)      # steps; evaluation also runs at step 0 and at the end.
  size: int = 256                 # held-out prompts.
  batch_size: int = resumable(256)  # prompts per sampler call (the last batch is padded: one compiled shape).
  accuracy_reward: str = "exact_match"  # accuracy = mean of this reward on greedy completions.
  samples: int = resumable(0)     # >0: also N completions per prompt at `temperature`, for avg@N, pass@k, maj@k.
  pass_k: tuple = resumable(())   # pass@k for each k <= samples (Chen et al. 2021's unbiased estimator).
  maj_k: tuple = resumable(())    # maj@k for each k <= samples (majority vote, averaged over all k-subsets).
  temperature: float = resumable(1.0)  # sampling temperature of those N completions.

  def __post_init__(self):
    # The estimators and their intervals: grpo_jax/stats/.
    s = Section(self, "eval")
    s.at_least(1, "size", "batch_size", "every")
    s.at_least(0, "samples")
    s.positive("temperature")
    for field in ("pass_k", "maj_k"):
      ks = getattr(self, field) if isinstance(getattr(self, field), (tuple, list)) else None
      if ks is None or not all(isinstance(k, int) and not isinstance(k, bool) and k >= 1 for k in ks):
        s.fail(field, "must be a tuple of positive ints, e.g. (1, 4, 16)")
      if ks and max(ks) > self.samples:
        s.fail(field, f"asks for k = {max(ks)} from eval.samples = {self.samples} completions per prompt; set "
               f"eval.samples >= {max(ks)}")


@dataclasses.dataclass(frozen=True)
class CheckpointSettings:
  """Checkpoints (grpo_jax/persist/checkpoint.py) and preemption (grpo_jax/persist/preemption.py)."""
  every: int = resumable(100)     # steps; a checkpoint is also written at the end.
  keep: int = resumable(2)        # keep the last K checkpoints (>= 2 gives a fallback if the newest is bad).
  export_hf: bool = resumable(False)  # at the end, also write the policy as a Hugging Face model in WORKDIR/hf_model
                                  # (grpo_jax/train/export.py; grpo-export does it for any checkpoint).
  verify: bool = True             # store a fingerprint of the saved state and check it on restore.
  async_save: bool = resumable(True)  # write checkpoints in a background thread while training goes on.
  preemption_deadline_s: float = resumable(25.0)  # on SIGTERM/SIGINT: save the last completed step and exit (code 75)
                                  # within this many seconds (GCP spot gives 30 s, AWS spot 120 s; docs/cloud.md).
  preemption_notice: str = resumable("")  # also stop on a cloud's early warning: "gce" (the `preempted` metadata key)
                                  # or "aws" (spot/instance-action, 2 min ahead); "" only on signals.
  lease_ttl_s: float = resumable(60.0)  # a workdir on gs:// or s3://: the run holds a lease object there, renewed every
                                  # ttl/3 s; another launch takes it over once not renewed for this long (a relaunch on
                                  # the same host whose holder's pid is gone: at once). Local: flock.

  def __post_init__(self):
    s = Section(self, "checkpoint")
    s.at_least(1, "every", "keep")
    s.positive("preemption_deadline_s", "lease_ttl_s")
    s.one_of("preemption_notice", ("", "gce", "aws"))


@dataclasses.dataclass(frozen=True)
class LogSettings:
  """Logging: metrics, samples, TensorBoard, Weights & Biases, the progress bar and the curves."""
  RESUMABLE: typing.ClassVar[bool] = True  # the same run laid out or logged otherwise
  every: int = 1                  # metrics.jsonl / TensorBoard every N steps.
  samples_every: int = 50         # sampled completions with rewards to samples.jsonl and the console.
  num_samples: int = 4            # completions written to samples.jsonl each samples_every steps.
  tensorboard: bool = True        # TensorBoard event files in the workdir.
  wandb: bool = False             # also log to Weights & Biases (pip install 'grpo_jax[wandb]'): scalars and samples.
  wandb_project: str = "grpo_jax"  # wandb project (with log.wandb).
  wandb_entity: str = ""          # "": the account's default.
  wandb_name: str = ""            # "": the workdir's name. The W&B run id is the run's own (a resume continues it).
  wandb_mode: str = "online"      # "online", or "offline" (written under WORKDIR/wandb; `wandb sync` uploads it).
  progress_bar: bool = True       # a tqdm bar over the steps; off a terminal, a line every 30 s instead.
  plot: bool = True               # curves.png in the workdir: after evaluations (an idle-priority helper), at the end.

  def __post_init__(self):
    s = Section(self, "log")
    s.at_least(1, "every", "samples_every")
    s.at_least(0, "num_samples")
    s.one_of("wandb_mode", ("online", "offline"))


@dataclasses.dataclass(frozen=True)
class Settings:
  """A whole run: its own keys, then one section per part."""
  seed: int = 0                   # run seed: model init, data order, sampling; a run is reproducible from it.
  num_steps: int = resumable(300) # GRPO steps (rollout batches).
  model: ModelSettings = _section(ModelSettings)
  moe: MoeSettings = _section(MoeSettings)
  env: EnvSettings = _section(EnvSettings)
  precision: PrecisionSettings = _section(PrecisionSettings)
  # Compiled programs saved for later processes (a resume, a rerun, a sweep's other seeds): grpo_jax/compile_cache.py.
  compile_cache_dir: str = resumable("auto")  # "auto": ~/.cache/grpo_jax/xla on GPUs/TPUs, off on CPUs; a path; "":
                                  # off.
  mesh: MeshSettings = _section(MeshSettings)
  distributed: DistributedSettings = _section(DistributedSettings)
  task: TaskSettings = _section(TaskSettings)
  # Reward functions by registered name -> weight; the total reward is the weighted sum, each is logged.
  rewards: dict = _map(exact_match=1.0)
  # Format gating: reward name -> format reward name; that reward scores only where the format reward is 1
  # (e.g. {"gsm8k_accuracy": "format_strict"}), a guard against rewarding unparseable answers.
  reward_gates: dict = _map()
  # More rewards by import path "package.module:function" (or registered name), as TRL's reward_funcs, since the
  # keys of `rewards` cannot hold dots: --config.reward_funcs='("my_pkg.rewards:brevity",)'. Logged under the path.
  reward_funcs: tuple = ()
  reward_weights: tuple = ()      # one weight per reward_funcs entry; empty: 1.0 each.
  reward_timeout_s: float = resumable(10.0)  # a reward call slower than this scores `reward_fallback` (and is counted).
  reward_fallback: float = 0.0    # the score of a reward call that raised, timed out or was not finite.
  reward_isolation: str = resumable("process")  # "process": rewards run in a worker process that a timeout kills (a
                                  # spinning or GIL-holding reward costs about reward_timeout_s); "thread": in the
                                  # trainer's process (rewards that share its memory, e.g. a reward model).
  sampling: SamplingSettings = _section(SamplingSettings)
  grpo: GrpoSettings = _section(GrpoSettings)
  rollout: RolloutSettings = _section(RolloutSettings)
  optim: OptimSettings = _section(OptimSettings)
  warmstart: WarmstartSettings = _section(WarmstartSettings)
  eval: EvalSettings = _section(EvalSettings)
  checkpoint: CheckpointSettings = _section(CheckpointSettings)
  log: LogSettings = _section(LogSettings)

  @classmethod
  def from_config(cls, config) -> "Settings":
    """The frozen, checked settings of `config` (a ConfigDict, or nested dicts such as a saved config.json); a
    field the config lacks keeps its default, a key the settings lack (an old one) is ignored."""
    return _build(cls, config)

  def __post_init__(self):
    # The rewards' names and weights: grpo_jax/rewards/registry.py.
    s = Section(self)
    s.at_least(1, "num_steps")
    s.one_of("reward_isolation", ("process", "thread"))
    s.positive("reward_timeout_s")
    self._check_across_sections()

  def _check_across_sections(self) -> None:
    """Values that must agree across sections: batch sizes, widths and the context, LoRA and the reference."""
    g = self.grpo
    if self.rollout_batch_size % self.mini_batch_size:
      fail("grpo.mini_batch_size", f"does not divide the rollout batch prompts_per_step * group_size = "
           f"{g.prompts_per_step} * {g.group_size} = {self.rollout_batch_size}", self.mini_batch_size)
    if self.mini_batch_size % self.micro_batch_size:
      fail("grpo.micro_batch_size", f"does not divide the mini-batch size {self.mini_batch_size}",
           self.micro_batch_size)
    experts = self.moe.num_experts if not self.model.hf_path else 0  # a checkpoint's: checked when it is loaded
    if self.mesh.expert > 1 and experts % self.mesh.expert:
      fail("mesh.expert", f"does not divide moe.num_experts={experts} (each shard holds whole experts)",
           self.mesh.expert)
    if g.overlong_buffer > self.sampling.max_new_tokens:
      fail("grpo.overlong_buffer", f"must be <= sampling.max_new_tokens={self.sampling.max_new_tokens}",
           g.overlong_buffer)
    if self.env.name and self.env.max_episode_tokens < self.sampling.max_new_tokens:
      fail("env.max_episode_tokens", f"cannot hold one message of sampling.max_new_tokens="
           f"{self.sampling.max_new_tokens}", self.env.max_episode_tokens)
    if self.model.lora_rank and g.ref_reset_every:
      fail("grpo.ref_reset_every", "is not supported with LoRA (model.lora_rank > 0): the reference is the base "
           "model with the adapters off", g.ref_reset_every)
    budget = self.rollout.decode_budget
    if budget:  # rollouts that span updates: one process's single-turn batches of a fixed set of prompts
      why = {"grpo.dynamic_sampling": g.dynamic_sampling and "its later rounds' prompts depend on finished groups",
             "env.name": bool(self.env.name) and "an episode's turns wait on the environment",
             "moe.routing_replay": self.moe.routing_replay and "a continued row's routing would be the new weights'",
             "distributed.num_processes": self.distributed.num_processes > 1 and "one process only"}
      for key, reason in why.items():
        if reason:
          fail("rollout.decode_budget", f"is not supported with {key} ({reason}): set rollout.decode_budget = 0",
               budget)
    # The context is checked by `validate` after the task's checks (which say when a task needs model.hf_path),
    # and for a checkpoint once its config.json is read (grpo_jax/train/build.py): `check_context`.

  @property
  def rollout_batch_size(self) -> int:
    return self.grpo.prompts_per_step * self.grpo.group_size

  @property
  def mini_batch_size(self) -> int:
    return self.grpo.mini_batch_size or self.rollout_batch_size

  @property
  def micro_batch_size(self) -> int:
    return self.grpo.micro_batch_size or self.mini_batch_size

  @property
  def updates_per_step(self) -> int:
    return self.grpo.num_iterations * (self.rollout_batch_size // self.mini_batch_size)

  @property
  def prompt_repeats(self) -> int:
    """Rows per prompt forward in the update and the reference: gcd(micro-batch, G) with
    `model.share_prompt_forward` (every aligned run of that many rows lies in one group), else 1."""
    return math.gcd(self.micro_batch_size, self.grpo.group_size) if self.model.share_prompt_forward else 1

  @property
  def completion_width(self) -> int:
    """Columns of a completion in the update: env.max_episode_tokens with an environment, else
    sampling.max_new_tokens."""
    return self.env.max_episode_tokens if self.env.name else self.sampling.max_new_tokens

  @property
  def configured_rewards(self) -> dict[str, float]:
    """Every reward of the run, name (registered name or import path) -> weight: `rewards`, then `reward_funcs`."""
    weights = list(self.reward_weights) or [1.0] * len(self.reward_funcs)
    return {**{name: float(w) for name, w in self.rewards.items()},
            **{name: float(w) for name, w in zip(self.reward_funcs, weights)}}

  def check_context(self, context: int, source: str) -> None:
    """max_prompt_length + max_new_tokens (+ the episode's width with an environment) must fit in the model's
    `context` (`source` names where it was read)."""
    prompt, new = self.sampling.max_prompt_length, self.sampling.max_new_tokens
    width = self.completion_width
    if width != new and prompt + width > context:
      fail("env.max_episode_tokens", f"max_prompt_length + max_episode_tokens = {prompt} + {width} exceeds the "
           f"model's context {source}={context}", width)
    if prompt + new > context:
      fail("sampling.max_new_tokens", f"max_prompt_length + max_new_tokens = {prompt} + {new} = {prompt + new} "
           f"exceeds the model's context {source}={context}", new)


def _build(cls, values):
  """`cls` from a ConfigDict or dict section: nested sections built first (each checks itself), maps copied to
  dicts, lists (a config.json's tuples) back to tuples."""
  hints = typing.get_type_hints(cls)
  fields = {}
  for field in dataclasses.fields(cls):
    if field.name not in values:
      continue
    value = values[field.name]
    if dataclasses.is_dataclass(hints[field.name]):
      value = _build(hints[field.name], value)
    elif hasattr(value, "to_dict"):
      value = value.to_dict()
    elif isinstance(value, list):
      value = tuple(value)
    fields[field.name] = value
  return cls(**fields)

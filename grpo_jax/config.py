"""The base experiment config: every default of a grpo_jax run, documented; old key names; saved configs.

Experiment files (`experiments/NAME.py`) start from `get_config()` and change what they need; the launcher
locks the result, so a misspelt key on the command line (`--config.grpo.betta=0`) is an error, and
ml_collections rejects values of the wrong type (`--config.num_steps=abc`). `grpo_jax.train.checks.validate(config)`
then checks the values, before anything is compiled: each section by the module that consumes it
(`validate_config` in grpo_jax/train/optim.py, grpo_jax/sampling/config.py, ...), then the values that must agree
across sections; an error reads `config.<key>=<value>: <what is allowed>` (grpo_jax/config_checks.py). This
module is plain data and imports no layer above the base one (setup.cfg's contracts), so any module may read it.

Units: a "step" is one GRPO iteration (sample a rollout batch, then `num_iterations` passes of mini-batch
updates over it). An "update" is one optimizer step. Batch sizes count completions unless they say prompts.
"""
from __future__ import annotations

import ml_collections
from ml_collections import config_dict

# What a config implies (batch sizes, widths, the context check, the weighted rewards): grpo_jax/sizes.py, also
# under these names here.
from grpo_jax.sizes import (check_context, completion_width, configured_rewards, micro_batch_size,  # noqa: F401
                            mini_batch_size, prompt_repeats, rollout_batch_size)


def get_config() -> ml_collections.ConfigDict:
  """The base config. Every field an experiment may set exists here with its default."""
  c = ml_collections.ConfigDict()
  c.seed = 0                      # run seed: model init, data order, sampling; a run is reproducible from it.
  c.num_steps = 300               # GRPO steps (rollout batches).

  # --- Model -------------------------------------------------------------------------------------------
  c.model = m = ml_collections.ConfigDict()
  m.hf_path = ""                  # directory with a Hugging Face checkpoint (config.json + safetensors +
                                  # tokenizer); "" builds a fresh model from the fields below.
  m.vocab_size = 0                # 0: the tokenizer's vocabulary size.
  m.hidden_size = 64              # a fresh model's shape (ignored with hf_path): width D,
  m.intermediate_size = 256       # MLP hidden size F,
  m.num_layers = 2                # decoder layers,
  m.num_heads = 4                 # query heads,
  m.num_kv_heads = 4              # key/value heads (grouped-query attention when fewer),
  m.head_dim = 16                 # and the dimension of a head.
  m.max_position_embeddings = 32  # the context: max_prompt_length + max_new_tokens must fit in it.
  m.rope_theta = 10000.0          # RoPE base of a fresh model.
  m.rms_norm_eps = 1e-6           # RMSNorm epsilon of a fresh model.
  m.tie_word_embeddings = False   # a fresh model reuses the embedding as the output projection.
  m.param_dtype = "float32"       # dtype of the parameters and optimizer state ("float32", "bfloat16").
  m.dtype = "float32"             # compute dtype of activations (also used for HF checkpoints when set).
  m.remat = False                 # rematerialize decoder layers in the backward pass (saves memory).
  m.attention = "einsum"          # the update's attention: "einsum", "jax" (jax.nn.dot_product_attention, XLA)
                                  # or "cudnn" (its cuDNN flash attention; NVIDIA GPUs, bfloat16 compute).
  m.share_prompt_forward = True   # the update and the reference run each prompt once for its G rows (where
                                  # micro-batches hold whole groups, or parts of one): fewer FLOPs, same values.
  m.logprob_chunk_size = 128      # sequence chunk for log-probs: [B, chunk, V] logits at a time, never [B,T,V].
  m.offload_ref_params = False    # keep the reference parameters in pinned host memory between uses (a no-op,
                                  # logged, where the backend has none); saves one model copy per device.
  # LoRA (grpo_jax/model/lora.py): train low-rank adapters W + (alpha / rank) B A on the chosen projections, the
  # base weights frozen; with beta > 0 the reference is the base model (adapters off), no second copy.
  m.lora_rank = 0                 # 0: full fine-tuning.
  m.lora_alpha = 32.0             # the update's scale is lora_alpha / lora_rank.
  m.lora_targets = "all"          # "all" or comma-separated: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj,
                                  # down_proj (Hugging Face / peft names).

  # --- Multi-turn episodes (grpo_jax/envs, grpo_jax/sampling/episodes.py) -------------------------------
  # With env.name set, each completion is an episode: the policy's messages (each at most
  # sampling.max_new_tokens) alternate with the environment's observations, which are context but never trained
  # on. The rewards grade the last message; GRPO's advantage is the whole episode's.
  c.env = ml_collections.ConfigDict()
  c.env.name = ""                 # the environment (grpo_jax/envs), or "package.module:Class"; "": single turn.
  c.env.max_turns = 3             # messages per episode, at most.
  c.env.max_episode_tokens = 48   # the episode's width after the prompt: messages and observations.
  c.env.max_observation_tokens = 16  # an observation's tokens, at most (longer ones are cut).
  c.env.step_timeout_s = 10.0     # a reset/step that raises or takes longer ends its episode (episodes/env_failures).
  c.env.max_concurrent_steps = 64  # the episodes' reset/step calls of a turn run in threads, this many at once.

  # --- Numerics (grpo_jax/precision.py) ------------------------------------------------------------------
  c.precision = ml_collections.ConfigDict()
  c.precision.matmul = "default"  # float32 matmuls: "default" (TF32 on NVIDIA GPUs, bf16 on TPUs, f32 on CPUs),
                                  # "high", "highest" (full float32 everywhere).
  c.precision.deterministic = False  # XLA's deterministic GPU ops (bitwise-exact resume on GPUs; slower).

  # Compiled programs saved for later processes (a resume, a rerun, a sweep's other seeds): grpo_jax/compile_cache.py.
  c.compile_cache_dir = "auto"    # "auto": ~/.cache/grpo_jax/xla on GPUs/TPUs, off on CPUs; a path; "": off.

  # --- Devices -----------------------------------------------------------------------------------------
  c.mesh = ml_collections.ConfigDict()
  c.mesh.data = -1                # data-parallel axis size; -1: all devices not used by fsdp * tensor.
  c.mesh.fsdp = 1                 # parameters, gradients and optimizer state sharded along 'embed'.
  c.mesh.tensor = 1               # tensor parallelism over heads / MLP units / vocabulary.

  # Multi-host (jax.distributed; docs/scaling.md). "" / 0 / -1: detected from the environment.
  c.distributed = ml_collections.ConfigDict()
  c.distributed.enabled = "auto"  # "auto": when coordinator_address or a cluster environment is set; "yes", "no".
  c.distributed.coordinator_address = ""  # "host:port" of process 0.
  c.distributed.num_processes = 0  # processes of the run (0: from the environment).
  c.distributed.process_id = -1   # this process's index (-1: from the environment).
  c.distributed.local_device_ids = ""     # e.g. "0,1": the devices this process uses ("": all visible).

  # --- Task (data) and rewards ---------------------------------------------------------------------------
  c.task = t = ml_collections.ConfigDict()
  t.name = "addition"             # the task the prompts come from (grpo_jax/data/tasks.py).
  t.num_digits = 2                # addition: operands have 1..num_digits digits; word_arithmetic: exactly.
  t.min_terms = 3                 # chain_sum: each prompt sums min_terms..max_terms single digits;
  t.max_terms = 8                 # chain_sum: most terms of a chain.
  t.scratchpad_fraction = 0.5     # chain_sum: the warm start's share of written-out (running-sum) answers.
  t.tool_fraction = 0.5           # tool_arithmetic: the warm start's share of episodes that call the calculator.
  t.heldout_fraction = 0.1        # fraction of all problems (addition) or train rows (dataset without
                                  # heldout_path) reserved for evaluation, never trained on.
  t.holdout_fraction = config_dict.placeholder(float)  # the old name of heldout_fraction (RENAMED): still read.
  # dataset (grpo_jax/data/datasets.py): local JSONL / Parquet / .arrow / save_to_disk; GSM8K, MATH and
  # Countdown layouts are recognized, other columns need field_map. Needs model.hf_path (its tokenizer).
  t.train_path = ""               # dataset: the training file or directory.
  t.train_split = "train"         # the split of a DatasetDict directory.
  t.heldout_path = ""             # "": hold out heldout_fraction of the train rows.
  t.heldout_split = "test"        # dataset: the split of a save_to_disk DatasetDict used as held-out.
  t.field_map = ml_collections.ConfigDict()  # canonical field -> column, e.g. {"prompt": "q", "answer": "a"}.
  t.max_rows = 0                  # read at most this many rows of each file; 0: all.
  t.template = "plain"            # grpo_jax/data/templates.py's TEMPLATES; "chat": the tokenizer's template.
  t.system_prompt = ""            # chat template: the system message ("": none).
  t.answer_only = False           # reasoning_gym: prompt ends in "<answer>", completion stops at "</".
  t.prefill_think = False         # end the prompt with "<think>" (score with the format_*_prefilled rewards).
  # word_arithmetic (grpo_jax/data/word_arithmetic.py): sums asked in English, chat template, needs hf_path.
  # reasoning_gym:<dataset> (grpo_jax/data/reasoning_gym.py, pip install -e '.[gym]'): any reasoning-gym
  # dataset, its items rendered like dataset rows (template, system_prompt), needs hf_path; reward "reasoning_gym".
  t.options = ml_collections.ConfigDict()  # the dataset's own options, e.g. {"min_animals": 2}; composite:
                                  # {"datasets": {"leg_counting": {"weight": 2.0, "config": {...}}, ...}}.
  t.train_size = 10000            # training items: 0 .. train_size-1 of the dataset seeded train_seed ...
  t.train_seed = 1                # reasoning_gym: the training items' seed.
  t.heldout_size = 500            # ... held-out items: of the one seeded heldout_seed (eval.size of them are
  t.heldout_seed = 1_000_000      # evaluated), minus any whose question is a training question (counted).
  t.transfer = ""                 # word_arithmetic: further held-out sets, never trained on, comma-separated
                                  # ("three_digit,reworded"), evaluated at steps 0 and num_steps as
                                  # transfer/<name>/accuracy ...; "": none.

  # Reward functions by registered name -> weight; the total reward is the weighted sum, each is logged.
  c.rewards = ml_collections.ConfigDict({"exact_match": 1.0})
  # Format gating: reward name -> format reward name; that reward scores only where the format reward is 1
  # (e.g. {"gsm8k_accuracy": "format_strict"}), a guard against rewarding unparseable answers.
  c.reward_gates = ml_collections.ConfigDict()
  # More rewards by import path "package.module:function" (or registered name), as TRL's reward_funcs, since the
  # keys of `rewards` cannot hold dots: --config.reward_funcs='("my_pkg.rewards:brevity",)'. Logged under the path.
  c.reward_funcs = ()
  c.reward_weights = ()           # one weight per reward_funcs entry; empty: 1.0 each.
  c.reward_timeout_s = 10.0       # a reward call slower than this scores `reward_fallback` (and is counted).
  c.reward_fallback = 0.0         # the score of a reward call that raised, timed out or was not finite.
  c.reward_isolation = "process"  # "process": rewards run in a worker process that a timeout kills (a spinning
                                  # or GIL-holding reward costs about reward_timeout_s); "thread": in the
                                  # trainer's process (rewards that share its memory, e.g. a reward model).

  # --- Sampling ------------------------------------------------------------------------------------------
  c.sampling = s = ml_collections.ConfigDict()
  s.max_prompt_length = 8         # prompts are left-padded to this (one compiled shape), in tokens; longer
                                  # ones are an error (addition) or dropped and counted (dataset).
  s.max_new_tokens = 4            # completion length limit (L_max); the stop token counts.
  s.temperature = 1.0             # sampling temperature; the loss uses log-probs at the same temperature.
  s.top_k = 0                     # 0: off.
  s.top_p = 1.0                   # 1.0: off.

  # --- GRPO (semantics: docs/algorithms.md) ----------------------------------------------------------
  c.grpo = g = ml_collections.ConfigDict()
  g.group_size = 8                # G completions per prompt.
  g.prompts_per_step = 32         # prompts per rollout batch; rollout batch = prompts_per_step * group_size.
  g.num_iterations = 1            # mu: passes over each rollout batch.
  g.mini_batch_size = 0           # completions per optimizer update; 0: the whole rollout batch.
  g.micro_batch_size = 0          # completions per forward/backward (gradient accumulation); 0: mini-batch.
  g.advantage = "grpo"            # how a group's rewards become advantages (grpo_jax/algo/advantages.py).
  g.std_ddof = 1                  # 0 or 1: ddof of the group std (TRL/Tunix: 1; population std: 0).
  g.advantage_eps = 1e-4          # added to the std before dividing.
  g.policy_loss = "clipped"       # the policy term (grpo_jax/algo/policy_losses.py, or your own: register_loss).
  g.epsilon_low = 0.2             # clip range below: the ratio is clipped at 1 - epsilon_low.
  g.epsilon_high = config_dict.placeholder(float)   # None: = epsilon_low (DAPO clip-higher: 0.28).
  g.delta = config_dict.placeholder(float)          # dual-clip cap on the ratio for negative advantages.
  g.importance_level = "token"    # "sequence": GSPO (use small epsilons, e.g. 3e-4 / 4e-4).
  g.cispo_epsilon_high = 5.0      # CISPO's upper truncation of the importance weight.
  g.kl_estimator = "k3"           # the per-token KL estimator (grpo_jax/algo/kl.py).
  g.beta = 0.04                   # KL weight (DeepSeekMath 0.04); 0 skips the reference model entirely.
  g.entropy_coef = 0.0            # adds -entropy_coef * H per token.
  g.top_entropy_quantile = config_dict.placeholder(float)  # e.g. 0.2: gradient only on the top 20% entropy.
  g.aggregation = "seq_mean_token_mean"             # per-token losses to one scalar (grpo_jax/algo/aggregation.py).
  g.tis_cap = 0.0                 # truncated importance sampling: weight each token's policy term by
                                  # min(pi_old / pi_sampler, tis_cap) (TRL's default cap: 2); 0: off.
  g.ref_reset_every = 0           # reset the reference policy to the current one every N steps; 0: never.
  g.mask_truncated_completions = False  # DAPO: completions that hit max_new_tokens get no loss.
  g.overlong_buffer = 0           # DAPO soft overlong penalty over the last N tokens of max_new_tokens; 0: off.
  g.overlong_penalty_factor = 1.0  # DAPO: the overlong penalty at max_new_tokens (scales overlong_buffer's ramp).
  g.length_buckets = 4            # the update runs on prompts and completions cut to the smallest of 4 widths
                                  # (1/4, 2/4, 3/4, 4/4 of max_prompt_length / max_new_tokens, multiples of 8)
                                  # that holds the batch's longest: short answers cost less (one compiled
                                  # program per width used); 1: always the full widths (one program).
  g.dynamic_sampling = False      # DAPO dynamic sampling: drop groups whose rewards are all equal and sample
                                  # more prompts (same shapes, no recompile) until the batch has prompts_per_step
                                  # groups with signal ...
  g.dynamic_sampling_max_rounds = 4  # ... or this many sampler calls per step were made; a batch still short
                                  # is filled with zero-std groups (zero advantage: no policy gradient).

  # --- Optimizer (Optax) ---------------------------------------------------------------------------------
  c.optim = o = ml_collections.ConfigDict()
  o.learning_rate = 3e-4          # peak learning rate.
  o.schedule = "constant"         # "constant" or "cosine" (decays to min_lr_ratio * peak at num_steps).
  o.warmup_steps = 0              # linear warmup over this many GRPO steps.
  o.min_lr_ratio = 0.0            # cosine schedule: the final learning rate as a fraction of learning_rate.
  o.b1 = 0.9                      # AdamW first-moment decay.
  o.b2 = 0.999                    # AdamW second-moment decay.
  o.eps = 1e-8                    # AdamW epsilon.
  o.weight_decay = 0.0            # AdamW decoupled weight decay.
  o.grad_clip_norm = 1.0          # global-norm clipping; 0: off.

  # --- Supervised warm start (teacher-forced cross-entropy on gold answers) --------------------------------
  c.warmstart = w = ml_collections.ConfigDict()
  w.enabled = False               # a supervised warm start on the gold answers before GRPO.
  w.learning_rate = 3e-3          # its Adam learning rate,
  w.batch_size = 128              # its batch size,
  w.max_steps = 2000              # and its step limit (it stops earlier at target_accuracy).
  w.eval_every = 25               # held-out greedy accuracy is measured every N warm-start steps ...
  w.target_accuracy = 0.3         # ... and warm start stops at the first evaluation reaching this.
  w.init_checkpoint = ""          # instead of warm-starting: another run's workdir, whose starting point (its
                                  # warmstart/ directory, else checkpoints/0) this run starts GRPO from:
                                  # parameters, data position and step-0 evaluation (sweeps share one warm start).

  # --- Evaluation on held-out prompts ---------------------------------------------------------------------
  c.eval = e = ml_collections.ConfigDict()
  e.every = 50                    # steps; evaluation also runs at step 0 and at the end.
  e.size = 256                    # held-out prompts.
  e.batch_size = 256              # prompts per sampler call (the last batch is padded: one compiled shape).
  e.accuracy_reward = "exact_match"  # accuracy = mean of this reward on greedy completions.
  e.pass_k = 0                    # >0: also pass@k with k samples per prompt at `pass_k_temperature`.
  e.pass_k_temperature = 1.0      # sampling temperature of the pass@k evaluation.

  # --- Checkpoints, logging -------------------------------------------------------------------------------
  c.checkpoint = k = ml_collections.ConfigDict()
  k.every = 100                   # steps; a checkpoint is also written at the end.
  k.keep = 2                      # keep the last K checkpoints (>= 2 gives a fallback if the newest is bad).
  k.export_hf = False             # at the end, also write the policy as a Hugging Face model in WORKDIR/hf_model
                                  # (grpo_jax/train/export.py; grpo-export does it for any checkpoint).
  k.verify = True                 # store a fingerprint of the saved state and check it on restore.
  k.async_save = True             # write checkpoints in a background thread while training goes on.
  k.preemption_deadline_s = 25.0  # on SIGTERM/SIGINT: save the last completed step and exit (code 75) within
                                  # this many seconds (GCP spot gives 30 s, AWS spot 120 s; docs/cloud.md).
  k.preemption_notice = ""        # also stop on a cloud's early warning: "gce" (the `preempted` metadata key)
                                  # or "aws" (spot/instance-action, 2 min ahead); "" only on signals.
  k.lease_ttl_s = 60.0            # a workdir on gs:// or s3://: the run holds a lease object there, renewed every
                                  # ttl/3 s; another launch takes it over once not renewed for this long (a
                                  # relaunch on the same host whose holder's pid is gone: at once). Local: flock.

  c.log = lg = ml_collections.ConfigDict()
  lg.every = 1                    # metrics.jsonl / TensorBoard every N steps.
  lg.samples_every = 50           # sampled completions with rewards to samples.jsonl and the console.
  lg.num_samples = 4              # completions written to samples.jsonl each samples_every steps.
  lg.tensorboard = True           # TensorBoard event files in the workdir.
  lg.wandb = False                # also log to Weights & Biases (pip install 'grpo_jax[wandb]'): scalars and samples.
  lg.wandb_project = "grpo_jax"   # wandb project (with log.wandb).
  lg.wandb_entity = ""            # "": the account's default.
  lg.wandb_name = ""              # "": the workdir's name. The W&B run id is the run's own (a resume continues it).
  lg.wandb_mode = "online"        # "online", or "offline" (written under WORKDIR/wandb; `wandb sync` uploads it).
  lg.progress_bar = True          # a tqdm bar over the steps; off a terminal, a line every 30 s instead.
  lg.plot = True                  # curves.png in the workdir: after each evaluation (a nice-19 helper), at the end.
  return c


def _get(c, key):
  for part in filter(None, key.split(".")):
    c = c[part]
  return c


# Fields a resumed run may change: when to stop, what to log, how often to save or evaluate, and how the same
# computation is laid out on the devices. Any other change would make the resumed run a different experiment.
RESUMABLE_CHANGES = ("num_steps", "log.", "checkpoint.every", "checkpoint.keep", "checkpoint.async_save",
                     "checkpoint.preemption_deadline_s", "checkpoint.preemption_notice", "checkpoint.lease_ttl_s",
                     "eval.every", "eval.batch_size", "mesh.", "distributed.", "model.offload_ref_params",
                     "model.share_prompt_forward", "grpo.micro_batch_size", "grpo.length_buckets",
                     "reward_timeout_s", "reward_isolation", "compile_cache_dir", "checkpoint.export_hf",
                     "env.step_timeout_s", "env.max_concurrent_steps")


# Old field name -> new one. A config that sets an old name still works: `validate` moves the value to the new
# field with a DeprecationWarning, and a resume compares a saved config's old names as the new ones.
RENAMED = {"task.holdout_fraction": "task.heldout_fraction"}
# Removed key -> what to use instead. The key no longer exists, so setting it is an error naming the replacement
# (`unknown_key_message`); a saved config.json that has it still reads (`saved_with_defaults` keeps the value, a
# resume ignores keys the code no longer has).
REMOVED: dict[str, str] = {}


def keys(config=None) -> list[str]:
  """Every key of the config (default: the base config), dotted, sections included."""
  out = []

  def walk(node, prefix):
    for key, value in node.items():
      out.append(prefix + key)
      if isinstance(value, ml_collections.ConfigDict):
        walk(value, f"{prefix}{key}.")

  walk(get_config() if config is None else config, "")
  return out


def unknown_key_message(key: str) -> str:
  """One line for a key the config does not have: its replacement (RENAMED, REMOVED), else the closest keys."""
  import difflib
  if key in RENAMED:
    return f"config.{key} was renamed config.{RENAMED[key]}"
  if key in REMOVED:
    return f"config.{key} was removed: {REMOVED[key]}"
  sections = ("rewards", "reward_gates", "task.field_map", "task.options")  # name -> value maps, set whole
  known = [k for k in keys() if not isinstance(_get(get_config(), k), ml_collections.ConfigDict) or k in sections]
  leaf = key.rsplit(".", 1)[-1]
  close = [k for k in known if k.rsplit(".", 1)[-1] == leaf]  # the same name in another section
  close += [k for k in difflib.get_close_matches(key, known, n=3, cutoff=0.6) if k not in close]
  hint = f"; did you mean {' or '.join(f'config.{k}' for k in close[:3])}?" if close else ""
  return (f"config.{key}: no such key{hint} (every key and its default: docs/config.md)")


def apply_renamed(config) -> None:
  """Moves values set under an old name (RENAMED) to the new field, with a DeprecationWarning."""
  import warnings
  for old, new in RENAMED.items():
    value = _get(config, old)
    if value is None:
      continue
    warnings.warn(f"config.{old} is deprecated; use config.{new}", DeprecationWarning, stacklevel=3)
    _set(config, new, value)
    _set(config, old, None)


def upgrade_saved(saved: dict) -> dict:
  """A saved config.json (nested dicts) with its old field names (RENAMED) changed to the new ones."""
  import copy
  saved = copy.deepcopy(saved)
  for old, new in RENAMED.items():
    *path, leaf = old.split(".")
    parent = saved
    for part in path:
      parent = parent.get(part, {})
    value = parent.pop(leaf, None) if isinstance(parent, dict) else None
    if value is not None:
      *path, leaf = new.split(".")
      parent = saved
      for part in path:
        parent = parent.setdefault(part, {})
      parent.setdefault(leaf, value)
  return saved


def saved_with_defaults(saved: dict) -> ml_collections.ConfigDict:
  """A saved config.json as a ConfigDict: `upgrade_saved`, then every field the run predates (e.g. a config
  group added later) at its default, so the code of today reads a run of yesterday."""
  config = get_config()
  free_form = {"rewards", "reward_gates", "task.field_map", "task.options"}  # name -> value maps: the saved one replaces ours

  def merge(target, values: dict, prefix: str):
    for key, value in values.items():
      if (isinstance(value, dict) and isinstance(target.get(key), ml_collections.ConfigDict)
          and prefix + key not in free_form):
        merge(target[key], value, f"{prefix}{key}.")
      else:
        with target.ignore_type():
          target[key] = value

  merge(config, upgrade_saved(saved), "")
  return config


def _set(c, key, value):
  *path, leaf = key.split(".")
  _get(c, ".".join(path))[leaf] = value


def _flatten(tree: dict, prefix: str = "") -> dict:
  out = {}
  for key, value in tree.items():
    if isinstance(value, dict) and key not in ("rewards", "reward_gates", "field_map", "options"):
      out.update(_flatten(value, f"{prefix}{key}."))
    else:
      out[prefix + key] = value
  return out


def resume_differences(saved: dict, config) -> tuple[list[str], list[str]]:
  """(conflicts, accepted): the fields where `config` differs from the `saved` config (a run's config.json), as
  "field: saved -> new" lines, split into those a resume may not change and those it may (RESUMABLE_CHANGES)."""
  import json
  old, new = _flatten(upgrade_saved(saved)), _flatten(json.loads(config.to_json_best_effort()))
  for before in RENAMED:  # a run saved under an old name compares as the new one
    new.pop(before, None)
  conflicts, accepted = [], []
  for key in sorted(old.keys() & new.keys()):  # a field the saved run predates is not a difference
    if old[key] != new[key]:
      resumable = any(key == p or (p.endswith(".") and key.startswith(p)) for p in RESUMABLE_CHANGES)
      (accepted if resumable else conflicts).append(f"{key}: {old[key]!r} -> {new[key]!r}")
  return conflicts, accepted

"""Test fixtures (the one module of them in the library): tiny stand-ins for a real recipe's inputs, built
locally: a random Qwen2 checkpoint with its tokenizer, and small GSM8K- and Countdown-layout datasets. The
recipes' `:test` presets and the tests run the full path (load, template, sample, reward, update, checkpoint)
on them in seconds; nothing is downloaded.

The tokenizer is a byte-level BPE trained (with the `tokenizers` library) on the fixture texts and the prompt
templates, so every string encodes (no unknown tokens) and prompts stay short. It has Qwen's special tokens
`<|endoftext|>` (eos and padding), `<|im_start|>` and `<|im_end|>`, and a ChatML chat template written here.
The checkpoint is a randomly initialized `Transformer` saved with our own `save_pretrained` (no torch).

A tiny random Gemma 3 (`tiny_gemma3/`: one sliding-window layer and one global layer, Gemma's special tokens,
a BOS added by the tokenizer, Gemma 3's chat template) stands in for a Gemma checkpoint the same way, and two tiny
mixtures of experts with the ChatML fixture tokenizer for Qwen3-MoE (`tiny_qwen3_moe/`) and gpt-oss
(`tiny_gpt_oss/`) checkpoints, a tiny Qwen3.5 hybrid (`tiny_qwen3_5/`) and a tiny Gemma 4 (`tiny_gemma4/`, with
the Gemma fixture tokenizer).

    python -m grpo_jax.testing /tmp/fixtures   # writes tiny_qwen2/, tiny_gemma3/, tiny_qwen3_moe/, tiny_gpt_oss/,
                                               # tiny_qwen3_5/, tiny_gemma4/, gsm8k.jsonl, countdown.parquet
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile

import numpy as np

from grpo_jax.data.datasets import COUNTDOWN_QUESTION
from grpo_jax.data.templates import GEMMA3_CHAT_TEMPLATE, R1_SYSTEM_PROMPT, R1_ZERO_TEMPLATE
from grpo_jax.model import hf_io
from grpo_jax.model.config import FULL, LINEAR, SLIDING, ModelConfig, YarnRopeScaling
from grpo_jax.model.transformer import Transformer

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
CHECKPOINT_DIR = "tiny_qwen2"
GEMMA3_DIR = "tiny_gemma3"
QWEN3_MOE_DIR = "tiny_qwen3_moe"
GPT_OSS_DIR = "tiny_gpt_oss"
QWEN3_5_DIR = "tiny_qwen3_5"
GEMMA4_DIR = "tiny_gemma4"
GEMMA3_SPECIAL_TOKENS = ("<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>")
GSM8K_FILE = "gsm8k.jsonl"
COUNTDOWN_FILE = "countdown.parquet"
_DONE = ".complete"

# Hand-written grade-school problems in GSM8K's layout (reasoning, then "#### <number>").
GSM8K_ROWS = [
    ("Mia has 4 bags with 6 apples each. She eats 3 apples. How many apples are left?",
     "4 * 6 = <<4*6=24>>24 apples. 24 - 3 = <<24-3=21>>21.\n#### 21"),
    ("A book costs $12 and a pen costs $3. How much do 2 books and 5 pens cost?",
     "2 * 12 = 24. 5 * 3 = 15. 24 + 15 = 39.\n#### 39"),
    ("Sam runs 5 km every day for 2 weeks. How many km does he run?", "14 * 5 = 70.\n#### 70"),
    ("A class of 28 students splits into teams of 4. How many teams are there?", "28 / 4 = 7.\n#### 7"),
    ("The temperature was 3 degrees and dropped by 10 degrees. What is it now?", "3 - 10 = -7.\n#### -7"),
    ("A farmer has 1,200 eggs and sells 450. How many eggs remain?", "1200 - 450 = 750.\n#### 750"),
    ("Each box holds 9 pencils. How many pencils are in 11 boxes?", "9 * 11 = 99.\n#### 99"),
    ("Lena saves $15 a week. How many weeks until she has $120?", "120 / 15 = 8.\n#### 8"),
    ("A train travels 60 miles per hour for 3.5 hours. How far does it go?", "60 * 3.5 = 210.\n#### 210"),
    ("Tom had 50 stickers, gave 18 to Ana and bought 7 more. How many does he have?",
     "50 - 18 = 32. 32 + 7 = 39.\n#### 39"),
    ("A pizza has 8 slices. How many slices do 6 pizzas have?", "6 * 8 = 48.\n#### 48"),
    ("A shirt costs $40 and is 25% off. What is the price?", "40 * 0.75 = 30.\n#### 30"),
    ("There are 3 shelves with 14 books and 2 shelves with 9 books. How many books?",
     "3 * 14 = 42. 2 * 9 = 18. 42 + 18 = 60.\n#### 60"),
    ("Ben is 3 times as old as his 4-year-old sister. How old is Ben?", "3 * 4 = 12.\n#### 12"),
    ("A tank holds 500 liters and is 40% full. How many liters are in it?", "500 * 0.4 = 200.\n#### 200"),
    ("Kim reads 25 pages a day. How many pages does she read in 30 days?", "25 * 30 = 750.\n#### 750"),
]


def gsm8k_records() -> list[dict]:
  return [{"question": q, "answer": a} for q, a in GSM8K_ROWS]


def countdown_records(n: int = 16, seed: int = 0) -> list[dict]:
  """Countdown problems with a known solution: target = (a op b) op c for three numbers in 1..20."""
  rng = np.random.default_rng(seed)
  ops = [("+", lambda x, y: x + y), ("-", lambda x, y: x - y), ("*", lambda x, y: x * y)]
  records = []
  while len(records) < n:
    a, b, c = (int(v) for v in rng.integers(1, 21, size=3))
    (_, f), (_, g) = ops[rng.integers(3)], ops[rng.integers(3)]
    target = g(f(a, b), c)
    if target > 0:
      records.append({"nums": [a, b, c], "target": int(target)})
  return records


def _corpus() -> list[str]:
  texts = [R1_ZERO_TEMPLATE, R1_SYSTEM_PROMPT, "<think> </think> <answer> </answer>", "0123456789 +-*/=()$%.,"]
  texts += [q + "\n" + a for q, a in GSM8K_ROWS]
  texts += [COUNTDOWN_QUESTION.format(numbers=r["nums"], target=r["target"]) for r in countdown_records()]
  return texts


def build_tokenizer(vocab_size: int = 512):
  """A `PreTrainedTokenizerFast`: byte-level BPE trained on the fixture texts, with a ChatML chat template."""
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
  from transformers import PreTrainedTokenizerFast
  core = Tokenizer(models.BPE())
  core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  core.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS), show_progress=False,
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  core.train_from_iterator(_corpus(), trainer=trainer)
  return PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|endoftext|>", pad_token="<|endoftext|>",
                                 additional_special_tokens=["<|im_start|>", "<|im_end|>"],
                                 chat_template=CHAT_TEMPLATE)


def save_random_checkpoint(path: str, cfg: ModelConfig, tokenizer, seed: int = 0) -> str:
  """A randomly initialized `Transformer(cfg)` saved with our own save_pretrained (no torch), and `tokenizer`."""
  from flax import nnx

  os.makedirs(path, exist_ok=True)
  hf_io.save_pretrained(Transformer(cfg, rngs=nnx.Rngs(seed)), path)
  tokenizer.save_pretrained(path)
  return path


def build_checkpoint(path: str, *, seed: int = 0, max_position_embeddings: int = 1024) -> str:
  """A random tiny Qwen2 (GQA, q/k/v biases, tied embeddings) with the fixture tokenizer, in `path`."""
  tokenizer = build_tokenizer()
  cfg = ModelConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                    num_kv_heads=2, head_dim=8, max_position_embeddings=max_position_embeddings,
                    rope_theta=1_000_000.0, tie_word_embeddings=True, attention_bias=True, family="qwen2")
  return save_random_checkpoint(path, cfg, tokenizer, seed)


def build_qwen3_moe_checkpoint(path: str, *, seed: int = 0, max_position_embeddings: int = 1024) -> str:
  """A random tiny Qwen3-MoE (Qwen3-30B-A3B's layer: q/k norms, softmax top-k router renormalized, untied
  embeddings): 4 experts, 2 per token, the second layer a dense MLP (mlp_only_layers), with the fixture tokenizer."""
  tokenizer = build_tokenizer()
  cfg = ModelConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                    num_kv_heads=2, head_dim=8, max_position_embeddings=max_position_embeddings,
                    rope_theta=1_000_000.0, qk_norm=True, family="qwen3_moe", num_experts=4, num_experts_per_tok=2,
                    moe_intermediate_size=16, moe_layers=(True, False), norm_topk_prob=True)
  return save_random_checkpoint(path, cfg, tokenizer, seed)


def build_gpt_oss_checkpoint(path: str, *, seed: int = 0, max_position_embeddings: int = 1024,
                             sliding_window: int = 4) -> str:
  """A random tiny gpt-oss (a sliding-window layer, then a full one; 4 experts, 2 per token, router and expert
  biases, the clamped gate at 7, attention sinks, q/k/v/o biases, YaRN rope) with the fixture tokenizer. The window
  is shorter than the prompts."""
  tokenizer = build_tokenizer()
  cfg = ModelConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=16, num_layers=2, num_heads=4,
                    num_kv_heads=2, head_dim=8, max_position_embeddings=max_position_embeddings,
                    rope_theta=150_000.0, rms_norm_eps=1e-5, family="gpt_oss", layer_types=(SLIDING, FULL),
                    sliding_window=sliding_window, attention_bias=True, o_bias=True, attention_sinks=True,
                    rope_scaling=YarnRopeScaling(factor=4.0, original_max_position_embeddings=256),
                    num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, router="topk_softmax",
                    expert_bias=True, swiglu_limit=7.0)
  return save_random_checkpoint(path, cfg, tokenizer, seed)


def build_qwen3_5_checkpoint(path: str, *, seed: int = 0, max_position_embeddings: int = 1024) -> str:
  """A random tiny Qwen3.5 (two Gated DeltaNet layers, then full attention with its output gate and partial RoPE;
  norms as offsets from 1; tied embeddings, as the 0.8B) with the fixture tokenizer."""
  tokenizer = build_tokenizer()
  cfg = ModelConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_layers=3, num_heads=4,
                    num_kv_heads=2, head_dim=16, max_position_embeddings=max_position_embeddings, rope_theta=1e7,
                    partial_rotary_factor=0.25, tie_word_embeddings=True, qk_norm=True, attention_output_gate=True,
                    family="qwen3_5_text", layer_types=(LINEAR, LINEAR, FULL), linear_num_key_heads=2,
                    linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8)
  return save_random_checkpoint(path, cfg, tokenizer, seed)


def build_gemma3_tokenizer(vocab_size: int = 512):
  """A `PreTrainedTokenizerFast` shaped like Gemma's: <pad> 0, <eos> 1, <bos> 2 (added in front of every
  encoding with special tokens), <start_of_turn> / <end_of_turn>, and Gemma 3's chat template."""
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
  from transformers import PreTrainedTokenizerFast

  core = Tokenizer(models.BPE())
  core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  core.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(GEMMA3_SPECIAL_TOKENS),
                                show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  core.train_from_iterator(_corpus(), trainer=trainer)
  bos = core.token_to_id("<bos>")
  core.post_processor = processors.TemplateProcessing(single="<bos> $A", pair="<bos> $A <bos> $B",
                                                      special_tokens=[("<bos>", bos)])
  return PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>",
                                 additional_special_tokens=["<start_of_turn>", "<end_of_turn>"],
                                 chat_template=GEMMA3_CHAT_TEMPLATE)


def build_gemma3_checkpoint(path: str, *, seed: int = 0, max_position_embeddings: int = 1024,
                            sliding_window: int = 4) -> str:
  """A random tiny Gemma 3 (a sliding-window layer, then a global one; q/k norms, tied embeddings, two RoPE
  bases, query_pre_attn_scalar != head_dim) with the Gemma-like fixture tokenizer, in `path`. The window is
  shorter than the prompts, so the sliding layer's masking and ring-buffer cache are exercised."""
  tokenizer = build_gemma3_tokenizer()
  cfg = ModelConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                    num_kv_heads=2, head_dim=8, max_position_embeddings=max_position_embeddings,
                    rope_theta=1_000_000.0, local_rope_theta=10_000.0, tie_word_embeddings=True, qk_norm=True,
                    family="gemma3_text", layer_types=(SLIDING, FULL), sliding_window=sliding_window,
                    query_pre_attn_scalar=12.0)
  return save_random_checkpoint(path, cfg, tokenizer, seed)


def build_gemma4_checkpoint(path: str, *, seed: int = 0, max_position_embeddings: int = 1024,
                            sliding_window: int = 4) -> str:
  """A random tiny Gemma 4 shaped like E2B (sliding layers, then global ones with their own head_dim 16 and one
  kv head; the last 2 layers reading the first two's keys and values, with double-wide MLPs; per-layer inputs;
  soft-capping) plus attention_k_eq_v on the global layers (31B's), with the Gemma-like fixture tokenizer. The
  window is shorter than the prompts."""
  tokenizer = build_gemma3_tokenizer()
  cfg = ModelConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=32, num_layers=4, num_heads=4,
                    num_kv_heads=2, head_dim=8, max_position_embeddings=max_position_embeddings,
                    rope_theta=1_000_000.0, local_rope_theta=10_000.0, tie_word_embeddings=True, qk_norm=True,
                    query_pre_attn_scalar=1.0, family="gemma4_text", layer_types=(SLIDING, FULL, SLIDING, FULL),
                    sliding_window=sliding_window, global_head_dim=16, global_num_kv_heads=1, attention_k_eq_v=True,
                    num_kv_shared_layers=2, double_wide_mlp=True, per_layer_input_size=4,
                    per_layer_input_vocab_size=len(tokenizer), final_logit_softcapping=30.0)
  return save_random_checkpoint(path, cfg, tokenizer, seed)


def write_jsonl(path: str, records: list[dict]) -> str:
  with open(path, "w", encoding="utf-8") as f:
    for record in records:
      f.write(json.dumps(record) + "\n")
  return path


def write_parquet(path: str, records: list[dict]) -> str:
  import pyarrow as pa
  import pyarrow.parquet as pq
  pq.write_table(pa.Table.from_pylist(records), path)
  return path


# ensure_fixtures' keys -> (directory or file name, builder).
FIXTURES = {"checkpoint": (CHECKPOINT_DIR, build_checkpoint),
            "gemma3_checkpoint": (GEMMA3_DIR, build_gemma3_checkpoint),
            "qwen3_moe_checkpoint": (QWEN3_MOE_DIR, build_qwen3_moe_checkpoint),
            "gpt_oss_checkpoint": (GPT_OSS_DIR, build_gpt_oss_checkpoint),
            "qwen3_5_checkpoint": (QWEN3_5_DIR, build_qwen3_5_checkpoint),
            "gemma4_checkpoint": (GEMMA4_DIR, build_gemma4_checkpoint),
            "gsm8k": (GSM8K_FILE, lambda path: write_jsonl(path, gsm8k_records())),
            "countdown": (COUNTDOWN_FILE, lambda path: write_parquet(path, countdown_records()))}


def build_all(directory: str) -> dict[str, str]:
  """Writes the checkpoints and both datasets into `directory`; returns their paths."""
  os.makedirs(directory, exist_ok=True)
  return {key: build(os.path.join(directory, name)) for key, (name, build) in FIXTURES.items()}


def default_directory() -> str:
  """$GRPO_JAX_FIXTURES, else grpo_jax_fixtures in the system temp directory."""
  return os.environ.get("GRPO_JAX_FIXTURES") or os.path.join(tempfile.gettempdir(), "grpo_jax_fixtures")


def ensure_fixtures(directory: str | None = None) -> dict[str, str]:
  """The fixture paths in `directory` (default: `default_directory()`), built on first use.

  Built in a sibling temp directory and renamed into place, so concurrent callers never see half a fixture.
  """
  directory = os.path.abspath(directory or default_directory())
  paths = {key: os.path.join(directory, name) for key, (name, _) in FIXTURES.items()}
  if os.path.exists(os.path.join(directory, _DONE)):
    for key in ("gemma3_checkpoint", "qwen3_moe_checkpoint", "gpt_oss_checkpoint", "qwen3_5_checkpoint",
                "gemma4_checkpoint"):
      if not os.path.exists(paths[key]):  # a directory built before this fixture existed
        _build_into(paths[key], FIXTURES[key][1])
    return paths
  os.makedirs(os.path.dirname(directory), exist_ok=True)

  def build_marked(staging: str) -> None:
    build_all(staging)
    open(os.path.join(staging, _DONE), "w").close()

  _build_into(directory, build_marked, marker=_DONE)
  return paths


def _build_into(path: str, build, marker: str = "") -> None:
  """build(staging) in a sibling temp directory, renamed to `path`. A concurrent builder may win: the rename then
  fails and `path` (its file `marker`, when given) exists; otherwise the failure is a real error."""
  staging = tempfile.mkdtemp(prefix=".fixture-", dir=os.path.dirname(path))
  try:
    build(staging)
    try:
      os.rename(staging, path)
    except OSError:
      if not os.path.exists(os.path.join(path, marker) if marker else path):
        raise
  finally:
    shutil.rmtree(staging, ignore_errors=True)


def apply_test_preset(c, dataset: str | None, checkpoint: str = "checkpoint"):
  """The recipes' `:test` preset: 2 GRPO steps of the full path (load, template, sample, reward, update,
  checkpoint) on the tiny random Qwen2 (`checkpoint`: another key of FIXTURES, e.g. "gemma3_checkpoint",
  "qwen3_moe_checkpoint", "gpt_oss_checkpoint", "gemma4_checkpoint") and the 16-problem fixture `dataset`
  ("gsm8k", "countdown", or None for a task that generates its own rows). Only sizes, data sources and logging
  change: the recipe's structure (remat, dtypes, the reference model, the loss, micro- and mini-batching) stays
  (tests/recipes)."""
  paths = ensure_fixtures()
  c.model.hf_path = paths[checkpoint]
  if dataset is not None:
    c.task.train_path = paths[dataset]
    c.task.heldout_path = ""
    c.task.heldout_fraction = 0.25
  c.num_steps = 2
  c.sampling.max_prompt_length = 192
  c.sampling.max_new_tokens = 8
  c.grpo.group_size = 4
  c.grpo.prompts_per_step = 2
  c.grpo.micro_batch_size = 4
  c.optim.learning_rate = 1e-3
  c.optim.warmup_steps = 0
  c.eval.every = 2
  c.eval.size = 4
  c.eval.batch_size = 4
  c.checkpoint.every = 2
  c.log.samples_every = 1
  c.log.progress_bar = False
  c.log.tensorboard = False
  c.log.plot = False


if __name__ == "__main__":
  # ensure_fixtures, not build_all: the directory gets its completion marker, so GRPO_JAX_FIXTURES=DIR finds it.
  print(json.dumps(ensure_fixtures(sys.argv[1] if len(sys.argv) > 1 else None), indent=2))

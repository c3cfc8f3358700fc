import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from grpo_jax.data.templates import R1_SYSTEM_PROMPT, R1_ZERO_TEMPLATE, render_prompt, tokenize_prompts
from grpo_jax.rewards import get_reward

# A ChatML-like template, written for this test.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
WORDS = ["[UNK]", "[PAD]", "<s>", "<|im_start|>", "<|im_end|>", "system", "user", "assistant", "what", "is", "2",
         "+", "?", "a", "long", "question", "be", "brief", "."]


@pytest.fixture(scope="module")
def tokenizer():
  core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
  core.pre_tokenizer = pre_tokenizers.Whitespace()
  tok = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="[UNK]", pad_token="[PAD]",
                                additional_special_tokens=["<|im_start|>", "<|im_end|>"])
  tok.chat_template = CHAT_TEMPLATE
  return tok


def test_r1_zero_template():
  text = render_prompt("what is 2 + 2 ?", "r1_zero")
  assert text == R1_ZERO_TEMPLATE.format(question="what is 2 + 2 ?")
  assert text.startswith("A conversation between User and Assistant.")
  assert "<think> </think>" in text and "<answer> </answer>" in text
  assert text.endswith("User: what is 2 + 2 ?\nAssistant:")
  prefilled = render_prompt("q", "r1_zero", prefill_think=True)
  assert prefilled.endswith("Assistant: <think>")
  # A completion continuing the prefilled prompt passes the prefilled strict format check.
  assert get_reward("format_strict_prefilled")([prefilled], [" 2+2=4 </think> <answer>4</answer>"]) == [1.0]


def test_chat_template_with_system_prompt(tokenizer):
  text = render_prompt("what is 2 + 2 ?", "chat", tokenizer, system_prompt="be brief .")
  assert text == ("<|im_start|>system\nbe brief .<|im_end|>\n<|im_start|>user\nwhat is 2 + 2 ?<|im_end|>\n"
                  "<|im_start|>assistant\n")
  no_system = render_prompt("what is 2 + 2 ?", "chat", tokenizer)
  assert no_system == "<|im_start|>user\nwhat is 2 + 2 ?<|im_end|>\n<|im_start|>assistant\n"
  assert R1_SYSTEM_PROMPT in render_prompt("q", "chat", tokenizer, system_prompt=R1_SYSTEM_PROMPT)


def test_conversational_prompts_render_as_given(tokenizer):
  """TRL's conversational form: the messages go to the chat template unchanged; the configured system prompt
  comes first unless the conversation has its own."""
  turns = [{"role": "user", "content": "what is 2 + 2 ?"}, {"role": "assistant", "content": "4 ."},
           {"role": "user", "content": "a question ?"}]
  text = render_prompt(turns, "chat", tokenizer, system_prompt="be brief .")
  assert text == ("<|im_start|>system\nbe brief .<|im_end|>\n<|im_start|>user\nwhat is 2 + 2 ?<|im_end|>\n"
                  "<|im_start|>assistant\n4 .<|im_end|>\n<|im_start|>user\na question ?<|im_end|>\n"
                  "<|im_start|>assistant\n")
  own = [{"role": "system", "content": "be brief ."}, {"role": "user", "content": "what is 2 + 2 ?"}]
  assert render_prompt(own, "chat", tokenizer, system_prompt="a long question") == render_prompt(
      "what is 2 + 2 ?", "chat", tokenizer, system_prompt="be brief .")
  with pytest.raises(ValueError, match="needs the 'chat' template .config.task.template., not 'r1_zero'"):
    render_prompt(own, "r1_zero")


def test_template_errors(tokenizer):
  with pytest.raises(ValueError, match="unknown template 'alpaca'"):
    render_prompt("q", "alpaca")
  with pytest.raises(ValueError, match="needs a tokenizer"):
    render_prompt("q", "chat")
  bare = PreTrainedTokenizerFast(tokenizer_object=tokenizer.backend_tokenizer, unk_token="[UNK]")
  bare.chat_template = None
  with pytest.raises(ValueError, match="no chat_template"):
    render_prompt("q", "chat", bare)


def test_tokenize_prompts_drops_long_ones(tokenizer):
  rows = [{"prompt": "what is 2 + 2 ?", "answer": "4"},
          {"prompt": "a long long long long long long question", "answer": "x"},
          {"prompt": "2 + 2", "answer": "4"}]
  # Token counts by hand (ChatML wrapping is <|im_start|> user ... <|im_end|> <|im_start|> assistant, 5 tokens;
  # a system message adds <|im_start|> system be brief . <|im_end|>, 6 more): 11, 13 and 8 without a system
  # prompt, 17, 19 and 14 with it.
  kept, dropped = tokenize_prompts(rows, tokenizer, max_prompt_tokens=12, template="chat")
  assert dropped == 1 and [r["answer"] for r in kept] == ["4", "4"]
  assert [len(r["prompt_ids"]) for r in kept] == [11, 8]
  kept_sys, dropped_sys = tokenize_prompts(rows, tokenizer, max_prompt_tokens=16, template="chat",
                                           system_prompt="be brief .")
  assert dropped_sys == 2 and kept_sys[0]["prompt"] == "2 + 2"
  ids = kept_sys[0]["prompt_ids"]
  assert tokenizer.convert_ids_to_tokens(ids) == ["<|im_start|>", "system", "be", "brief", ".", "<|im_end|>",
                                                  "<|im_start|>", "user", "2", "+", "2", "<|im_end|>",
                                                  "<|im_start|>", "assistant"]
  assert kept_sys[0]["prompt_text"].startswith("<|im_start|>system")
  assert "prompt_ids" not in rows[0]  # inputs are not modified


def test_tokenize_plain_counts_exactly(tokenizer):
  rows = [{"prompt": " ".join(["a"] * n)} for n in (3, 4, 5)]
  kept, dropped = tokenize_prompts(rows, tokenizer, max_prompt_tokens=4)
  assert dropped == 1 and [len(r["prompt_ids"]) for r in kept] == [3, 4]
  assert tokenize_prompts([], tokenizer, 4) == ([], 0)
  with pytest.raises(ValueError, match="max_prompt_tokens"):
    tokenize_prompts(rows, tokenizer, 0)

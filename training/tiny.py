"""A tiny randomly initialised Qwen2 model and a byte-level BPE tokenizer trained offline, for fast CPU
tests of the trainers: no downloads, built in well under a second."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mhqa_graph.graphs.omne import prompts as omne_prompts
from mhqa_graph.graphs.opera import prompts as opera_prompts

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


# the prompts the tokenizer learns merges from (the words the tests use), named one by one: a prompt added to the
# agents later (a new setting's) leaves the tiny models the tests were tuned on as they are
CORPUS_PROMPTS = (
    (omne_prompts, ("SYSTEM", "THINK_ON", "THINK_OFF", "QUESTION", "TOPIC_ENTITIES", "NUDGE", "UNGROUNDED",
                    "UNGROUNDED_FACTS", "ONE_HOP_SHORT", "REPEATED", "TOO_MANY_CALLS", "RESULT_CUT", "FORCE_ANSWER",
                    "NATIVE_SYSTEM")),
    (opera_prompts, ("PLAN_SYSTEM", "PLAN_USER", "PLAN_WORKED", "PLAN_HINT", "NO_SOURCE", "UNRESOLVED_QUERY",
                     "ANALYSIS_SYSTEM", "ANALYSIS_FORMAT_THINK", "ANALYSIS_FORMAT_DIRECT", "ANALYSIS_USER",
                     "REWRITE_SYSTEM", "REWRITE_USER", "ANSWER_SYSTEM", "ANSWER_USER", "ANSWER_OPTIONS")),
)


def _texts() -> list[str]:
    """The agents' prompts of CORPUS_PROMPTS and the tags of their turns."""
    texts = [getattr(module, name) for module, names in CORPUS_PROMPTS for name in names]
    return texts + ['<think>', '</think>', '<tool_call>', '</tool_call>', '<answer>', '</answer>',
                    '{"name": "node_info", "arguments": {"entity": "Paris", "graph_type": "kg"}}']


def tiny_tokenizer(texts: Sequence[str] | None = None, vocab_size: int = 512) -> Any:
    """A byte-level BPE PreTrainedTokenizerFast with a ChatML chat template; eos <|im_end|>, pad <|endoftext|>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(list(texts or _texts()), trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, chat_template=CHATML, bos_token=None,
                                   eos_token="<|im_end|>", pad_token="<|endoftext|>", unk_token=None,
                                   additional_special_tokens=["<|im_start|>"])


def tiny_model_and_tokenizer(seed: int = 0, hidden_size: int = 32, layers: int = 2, heads: int = 2) -> tuple[Any, Any]:
    """(Qwen2ForCausalLM with random weights from `seed`, its tokenizer), in float32 on CPU."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokenizer = tiny_tokenizer()
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                         num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
                         max_position_embeddings=4096, tie_word_embeddings=True,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer

"""A tiny randomly initialised Qwen2 model and a byte-level BPE tokenizer trained offline, for fast CPU
tests of the trainers: no downloads, built in well under a second."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mhqa_graph.graphs import omne_prompts, opera_prompts

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def _texts() -> list[str]:
    """The agents' own prompts: the tokenizer learns merges for the words the tests use. Prompts of settings that are
    off by default (the `ask_as="relation"` form) are left out, so that the tiny models the tests train stay the
    same when such a prompt is added."""
    texts = [v for m in (omne_prompts, opera_prompts) for k, v in vars(m).items()
             if k.isupper() and isinstance(v, str) and not k.startswith("RELATION_")]
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

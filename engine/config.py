"""Engine configuration (flag names follow vLLM's) and the model facts read from config.json / GGUF."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from folio.engine.spec_decode.config import SpeculativeConfig, SpeculativeConfigError

DTYPES = ("auto", "float32", "bfloat16", "float16")
DEVICES = ("auto", "cpu", "cuda")
STRUCTURED_OUTPUTS_BACKENDS = ("xgrammar", "llguidance")  # `folio.engine.structured.compiler.BACKENDS`
SCHEDULING_POLICIES = ("fcfs", "priority")
# A sanity bound, far above any released model's context (10M tokens): a larger value is a typo.
MAX_MODEL_LEN_LIMIT = 1 << 25


class ConfigValueError(ValueError):
    """An engine setting out of its range; ``field`` names it (the flag is its kebab-case form)."""

    def __init__(self, field: str, rule: str, value: object) -> None:
        super().__init__(f"{field} must be {rule}, got {value!r}")
        self.field, self.rule, self.value = field, rule, value


DEFAULT_MAX_NUM_SEQS = 256  # sequences running at once (the router's slots per replica when tenants queue)


@dataclass
class EngineConfig:
    model: str
    dtype: str = "auto"
    device: str = "auto"
    max_model_len: int | None = None
    block_size: int = 16
    kv_cache_memory_gib: float | None = None  # KV budget; default: a CPU share of RAM or the GPU utilization
    gpu_memory_utilization: float = 0.9
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    max_num_batched_tokens: int | None = None  # per-step token budget; None: max(2048, max_num_seqs)
    enable_prefix_caching: bool = True
    digest: str | None = None
    seed: int = 0
    enforce_eager: bool = False
    # Off: a prompt is prefilled in one step (the budget then has to cover max_model_len).
    enable_chunked_prefill: bool = True
    tokenizer: str | None = None  # a tokenizer folder; default: the model folder / the GGUF's vocabulary
    fault_logit_noise: float = 0.0  # test aid: Gaussian noise of this std on the logits (folio.engine.prompt_logits)
    # Processes (one per device) the model is sharded over (`folio.engine.distributed`).
    tensor_parallel_size: int = 1
    # Stages (each a contiguous range of layers) the model is split over (`folio.engine.distributed.pipeline`);
    # with tensor parallelism, T × P processes.
    pipeline_parallel_size: int = 1
    # Several nodes (vLLM's flags): the T × P ranks over ``nnodes`` processes' machines, T × P / nnodes each;
    # node rank 0 holds rank 0 (which schedules and serves) and the rendezvous at master_addr:master_port
    # (and master_port + 1 for its steps to the other nodes' ranks).
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    # Seconds every rank has to arrive at start (spawned processes, or a group's pods being scheduled and
    # pulling their image): one that does not fails the group with the ranks missing.
    rendezvous_timeout: float = 600.0
    # Seconds a tensor-parallel collective may wait before the watchdog takes the replica down.
    collective_timeout: float = 15.0
    # Multi-LoRA (vLLM's flags): adapters in ``max_loras`` device slots of rank up to ``max_lora_rank``, a
    # host cache of ``max_cpu_loras`` loaded ones (None: max_loras).
    enable_lora: bool = False
    max_loras: int = 1
    max_lora_rank: int = 16
    max_cpu_loras: int | None = None
    # The grammar library of structured output (`folio.engine.structured.compiler`), as vLLM's flag.
    structured_outputs_backend: str = "xgrammar"
    # vLLM's: "fcfs", or "priority" (requests' ``priority``, lower first; the lowest preempted first)
    scheduling_policy: str = "fcfs"
    # vLLM's --speculative-config: its JSON text or object, read into a `SpeculativeConfig` (None: off)
    speculative_config: SpeculativeConfig | dict[str, Any] | str | None = None

    def __post_init__(self) -> None:
        def bad(field: str, rule: str) -> ConfigValueError:
            return ConfigValueError(field, rule, getattr(self, field))

        if self.dtype not in DTYPES:
            raise bad("dtype", f"one of {', '.join(DTYPES)}")
        if self.device not in DEVICES:
            raise bad("device", f"one of {', '.join(DEVICES)}")
        if self.scheduling_policy not in SCHEDULING_POLICIES:
            raise bad("scheduling_policy", f"one of {', '.join(SCHEDULING_POLICIES)}")
        if self.structured_outputs_backend not in STRUCTURED_OUTPUTS_BACKENDS:
            raise bad("structured_outputs_backend", f"one of {', '.join(STRUCTURED_OUTPUTS_BACKENDS)}")
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise bad("block_size", "a power of two >= 1")
        if self.max_model_len is not None and not 1 <= self.max_model_len <= MAX_MODEL_LEN_LIMIT:
            raise bad("max_model_len", f"in [1, {MAX_MODEL_LEN_LIMIT}]")
        if self.kv_cache_memory_gib is not None and not self.kv_cache_memory_gib > 0:
            raise bad("kv_cache_memory_gib", "> 0")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise bad("gpu_memory_utilization", "in (0, 1]")
        if self.max_num_seqs < 1:
            raise bad("max_num_seqs", ">= 1")
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < 1:
            raise bad("max_num_batched_tokens", ">= 1")
        if not 0 <= self.fault_logit_noise < float("inf"):
            raise bad("fault_logit_noise", "a finite number >= 0")
        if self.tensor_parallel_size < 1:
            raise bad("tensor_parallel_size", ">= 1")
        if self.pipeline_parallel_size < 1:
            raise bad("pipeline_parallel_size", ">= 1")
        world = self.tensor_parallel_size * self.pipeline_parallel_size
        if self.nnodes < 1 or world % self.nnodes or (world // self.nnodes) % self.tensor_parallel_size:
            raise ConfigValueError(
                "nnodes", f"a divisor of tensor_parallel_size × pipeline_parallel_size ({world}) that leaves each "
                f"node whole tensor-parallel groups of {self.tensor_parallel_size}", self.nnodes)
        if not 0 <= self.node_rank < self.nnodes:
            raise bad("node_rank", f"in [0, nnodes) = [0, {self.nnodes})")
        if not 1 <= self.master_port <= 65534:
            raise bad("master_port", "in [1, 65534] (the port after it is used too)")
        if not self.rendezvous_timeout > 0:
            raise bad("rendezvous_timeout", "> 0")
        if not self.collective_timeout > 0:
            raise bad("collective_timeout", "> 0")
        if self.max_loras < 1:
            raise bad("max_loras", ">= 1")
        if self.max_lora_rank < 1:
            raise bad("max_lora_rank", ">= 1")
        if self.max_cpu_loras is not None and self.max_cpu_loras < self.max_loras:
            raise bad("max_cpu_loras", f">= max_loras ({self.max_loras})")
        if self.speculative_config is not None and not isinstance(self.speculative_config, SpeculativeConfig):
            try:
                self.speculative_config = SpeculativeConfig.parse(self.speculative_config)
            except SpeculativeConfigError as exc:
                raise bad("speculative_config", f"vLLM's speculative JSON ({exc})") from None
        if self.pipeline_parallel_size > 1:
            if self.speculative_config is not None:
                raise bad("speculative_config", "unset with pipeline parallelism (not supported together yet)")
            if self.enable_lora:
                raise bad("enable_lora", "off with pipeline parallelism (not supported together yet)")

    @property
    def world_size(self) -> int:
        """The processes the engine runs on: tensor_parallel_size × pipeline_parallel_size."""
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def speculative(self) -> SpeculativeConfig | None:
        assert self.speculative_config is None or isinstance(self.speculative_config, SpeculativeConfig)
        return self.speculative_config

    @property
    def max_decode_rows(self) -> int:
        """The most single-token rows a decode step holds: a row per sequence, and with speculation one more
        per proposed token (a verify step), so the decode graphs take verify steps too."""
        spec = self.speculative
        return self.max_num_seqs * (1 + (spec.num_speculative_tokens if spec is not None else 0))


@dataclass
class ModelConfig:
    """The architecture facts the engine needs, from an HF config or GGUF metadata. ``hf`` is the
    `transformers` config object itself: each family reads its own quirks from it."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    eos_token_ids: list[int] = field(default_factory=list)
    max_model_len: int = 0  # effective context length, set by the engine
    hf: Any = field(default=None, repr=False)

    @classmethod
    def from_hf(cls, raw: dict[str, Any], architecture: str) -> ModelConfig:
        """From a config.json dict (or one derived from GGUF metadata) and its resolved architecture."""
        from transformers import AutoConfig

        kwargs = {k: v for k, v in raw.items() if k != "model_type"}
        hf = AutoConfig.for_model(raw["model_type"], **kwargs)
        heads = hf.num_attention_heads
        eos = raw.get("eos_token_id", getattr(hf, "eos_token_id", None))
        return cls(
            architecture=architecture,
            vocab_size=hf.vocab_size,
            hidden_size=hf.hidden_size,
            intermediate_size=hf.intermediate_size,
            num_hidden_layers=hf.num_hidden_layers,
            num_attention_heads=heads,
            num_key_value_heads=getattr(hf, "num_key_value_heads", None) or heads,
            head_dim=getattr(hf, "head_dim", None) or hf.hidden_size // heads,
            rms_norm_eps=float(getattr(hf, "rms_norm_eps", 1e-6)),
            max_position_embeddings=getattr(hf, "max_position_embeddings", 2048),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", getattr(hf, "tie_word_embeddings", False))),
            eos_token_ids=[eos] if isinstance(eos, int) else list(eos or []),
            hf=hf,
        )

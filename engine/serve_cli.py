"""`folio serve`: one engine replica behind an OpenAI-compatible HTTP API.

Engine flags follow vLLM's names. Heavy imports (torch, uvicorn, FastAPI) happen inside `main`, so
`folio --help` stays instant.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import gc
import json
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from folio.engine.config import DEFAULT_MAX_NUM_SEQS, SCHEDULING_POLICIES, STRUCTURED_OUTPUTS_BACKENDS
from folio.engine.digest import DIGEST_RE
from folio.engine.rules import DEFAULT_MAX_REQUEST_BODY_BYTES
from folio.engine.server.adapter_faults import FAULT_FILE
from folio.engine.server.read_timeouts import DEFAULT_BODY_S, DEFAULT_HEADER_S
from folio.engine.tools.parsers import PARSERS

if TYPE_CHECKING:
    from folio.engine.config import EngineConfig
    from folio.engine.llm_engine import LLMEngine
    from folio.engine.server.admission import Faults


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model", required=True, help="a Hugging Face style folder, a .gguf file, or pkg://DISTRIBUTION/PATH"
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    parser.add_argument("--port", type=int, default=8000, help="port to listen on (default: %(default)s)")
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=0,
        help="also serve GET /metrics (alone) on this port, on the same host; 0: only on --port (default: %(default)s)",
    )
    parser.add_argument("--served-model-name", help="the model name clients send (default: --model)")
    parser.add_argument("--tokenizer", help="tokenizer folder (default: the model's own)")
    parser.add_argument("--revision", help="the pinned model revision, shown in the /v1/models card")
    parser.add_argument("--digest", help="sha256:… content digest the weights must match before serving")

    eng = parser.add_argument_group("engine")
    eng.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    eng.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    eng.add_argument("--max-model-len", type=int, help="context length (default: the model's)")
    eng.add_argument("--block-size", type=int, default=16, help="tokens per KV-cache block")
    kv = eng.add_mutually_exclusive_group()
    kv.add_argument("--kv-cache-memory-gib", type=float, help="KV-cache budget in GiB")
    kv.add_argument(
        "--gpu-memory-utilization", type=float, default=0.9, help="GPU memory share (default: 0.9)"
    )
    eng.add_argument("--max-num-seqs", type=int, default=DEFAULT_MAX_NUM_SEQS, help="sequences in a batch at most")
    eng.add_argument("--max-num-batched-tokens", type=int, help="tokens per scheduler step at most")
    eng.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True)
    eng.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction, default=True)
    eng.add_argument(
        "--enforce-eager", action=argparse.BooleanOptionalAction, default=False,
        help="no decode graphs (CUDA graphs, CPU step graphs)",
    )  # fmt: skip
    eng.add_argument("--seed", type=int, default=0, help="engine seed for unseeded sampling")
    eng.add_argument(
        "--scheduling-policy", choices=SCHEDULING_POLICIES, default="fcfs",
        help="fcfs, or priority: requests' priority field orders the queue, lowest value first, and the lowest "
        "priorities are preempted first (default: %(default)s)",
    )  # fmt: skip
    eng.add_argument(
        "--structured-outputs-backend", choices=STRUCTURED_OUTPUTS_BACKENDS, default="xgrammar",
        help="the grammar library of structured output (default: %(default)s)",
    )  # fmt: skip
    eng.add_argument(
        "--tensor-parallel-size", type=int, default=1, help="processes (one per device) the model is sharded over"
    )
    eng.add_argument(
        "--pipeline-parallel-size", type=int, default=1,
        help="stages the layers are split over (× the tensor-parallel size: the processes; default: %(default)s)",
    )  # fmt: skip
    nodes = parser.add_argument_group("several nodes (a LeaderWorkerSet group's pods)")
    nodes.add_argument("--nnodes", type=int, default=1, help="nodes the ranks are spread over (default: %(default)s)")
    nodes.add_argument("--node-rank", type=int, help="this node's rank (default: $LWS_WORKER_INDEX, else 0)")
    nodes.add_argument(
        "--master-addr", help="node 0's address, where rank 0 listens (default: $LWS_LEADER_ADDRESS, else 127.0.0.1)"
    )
    nodes.add_argument(
        "--master-port", type=int, default=29500,
        help="rank 0's rendezvous port; the next one carries its steps to the other nodes (default: %(default)s)",
    )  # fmt: skip
    nodes.add_argument(
        "--headless", action="store_true",
        help="run this node's ranks without an API (node ranks above 0, which are always headless)",
    )  # fmt: skip
    nodes.add_argument(
        "--rendezvous-timeout", type=float, default=600.0,
        help="seconds every rank has to arrive at start before the group fails (default: %(default)s)",
    )  # fmt: skip
    eng.add_argument(
        "--speculative-config", metavar="JSON",
        help='speculative decoding, vLLM\'s JSON: {"method": "ngram", "num_speculative_tokens": K, '
        '"prompt_lookup_max": N, "prompt_lookup_min": M} (prompt lookup; default: off)',
    )  # fmt: skip
    eng.add_argument(
        "--collective-timeout",
        type=float,
        default=15.0,
        help="seconds a tensor-parallel collective may wait before the replica goes down (default: %(default)s)",
    )

    _add_lora_arguments(parser)

    tools = parser.add_argument_group("tool calling")
    tools.add_argument(
        "--enable-auto-tool-choice", action="store_true",
        help='serve tool_choice "auto": read calls out of the answers with the tool-call parser',
    )  # fmt: skip
    tools.add_argument(
        "--tool-call-parser", choices=list(PARSERS),
        help="the format the model calls tools in (default: its family's: Qwen hermes, Llama llama3_json, "
        "Mistral mistral)",
    )  # fmt: skip

    srv = parser.add_argument_group("server")
    srv.add_argument("--max-n", type=int, default=8, help="largest n (choices per prompt) accepted")
    srv.add_argument(
        "--max-queued-requests",
        type=int,
        default=256,
        help="answer 503 + Retry-After when a request would take the sequences waiting for the engine past this",
    )
    srv.add_argument(
        "--max-sequences-per-request",
        type=int,
        default=64,
        help="answer 400 to a request of more sequences (n × prompts) than this (default: %(default)s)",
    )
    srv.add_argument(
        "--max-request-body-bytes",
        type=int,
        default=DEFAULT_MAX_REQUEST_BODY_BYTES,
        help="answer 413 to a request body larger than this; the same default as `folio router`'s "
        "(default: %(default)s, 32 MiB)",
    )
    srv.add_argument(
        "--enable-docs",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="serve /docs and /openapi.json (off by default: the engine has no authentication)",
    )
    srv.add_argument(
        "--header-timeout",
        type=float,
        default=DEFAULT_HEADER_S,
        help="seconds a client has to send a request's headers before it is disconnected (default: %(default)s)",
    )
    srv.add_argument(
        "--body-timeout",
        type=float,
        default=DEFAULT_BODY_S,
        help="seconds a client has to send a request's body after its headers (default: %(default)s)",
    )
    srv.add_argument(
        "--shutdown-timeout",
        type=float,
        default=30.0,
        help="seconds in-flight requests get to finish after SIGTERM (default: %(default)s)",
    )
    srv.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])

    faults = parser.add_argument_group("fault injection (test aids, off by default)")
    faults.add_argument(
        "--fault-error-rate", type=float, default=0.0, help="answer this fraction of API requests with a 500"
    )
    faults.add_argument("--fault-latency-ms", type=float, default=0.0, help="delay each API request by N ms")
    faults.add_argument(
        "--fault-crash-after-tokens", type=int, default=0, metavar="N",
        help="kill this process with SIGKILL once it has generated N tokens, mid-answer (0: never)",
    )  # fmt: skip
    faults.add_argument(
        "--fault-logit-noise",
        type=float,
        default=0.0,
        metavar="STD",
        help="add Gaussian noise of this std to the logits (sampling, prompt logprobs, parity): answers differ, "
        "nothing fails",
    )
    faults.add_argument(
        "--fault-adapter-files", action="store_true",
        help=f"honor a {FAULT_FILE} in an adapter's folder ({{\"errorRate\": R}}): requests under that adapter are "
        "answered with a 500 at rate R, the others are not (a faulty adapter revision)",
    )  # fmt: skip


def _add_lora_arguments(parser: argparse.ArgumentParser) -> None:
    lora = parser.add_argument_group("LoRA adapters (vLLM's flags)")
    lora.add_argument(
        "--enable-lora", action=argparse.BooleanOptionalAction, default=False,
        help="serve LoRA adapters of the model: a request names one in its 'model'",
    )  # fmt: skip
    lora.add_argument(
        "--lora-modules",
        nargs="+",
        metavar="MODULE",
        # SUPPRESS: the flag names pod-local folders, so it is no spec.engine.args key (the operator lists
        # the parser's flags and skips suppressed ones); adapters get their own place in the spec
        default=argparse.SUPPRESS,
        help="adapters to load at start-up, each NAME=PATH or JSON "
        '\'{"name": NAME, "path": PATH, "digest": "sha256:..."}\' (the digest, as `folio digest` prints it, '
        "pins the folder's content)",
    )
    lora.add_argument("--max-loras", type=int, default=1, help="adapters active on the device at once (default: %(default)s)")
    lora.add_argument("--max-lora-rank", type=int, default=16, help="the largest adapter rank served (default: %(default)s)")
    lora.add_argument(
        "--max-cpu-loras", type=int, help="adapters kept in host memory (LRU) beyond those on the device (default: --max-loras)"
    )
    lora.add_argument(
        "--allow-runtime-lora-updating",
        action="store_true",
        help="serve POST /v1/load_lora_adapter and /v1/unload_lora_adapter (as VLLM_ALLOW_RUNTIME_LORA_UPDATING=True "
        "does); off by default: anyone who reaches the API could load files by path",
    )


@dataclass(frozen=True)
class LoRAModule:
    """One --lora-modules adapter, as given (a `LoRARequest` once it has an id)."""

    name: str
    path: str
    digest: str | None = None


_MODULE_KEYS = {"name", "path", "digest", "base_model_name"}  # vLLM's JSON keys, and the digest


def parse_lora_module(text: str) -> LoRAModule:
    """``NAME=PATH`` or vLLM's JSON form with a digest; raises ValueError saying what is wrong with it."""
    if text.lstrip().startswith("{"):
        return _json_module(text)
    name, sep, path = text.partition("=")
    if not sep or not name.strip() or not path.strip():
        raise ValueError(f"--lora-modules {text!r}: expected NAME=PATH or a JSON object with name and path")
    return LoRAModule(name.strip(), path.strip())


def _json_module(text: str) -> LoRAModule:
    try:
        spec = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--lora-modules {text!r}: invalid JSON: {exc}") from None
    if not isinstance(spec, dict):
        raise ValueError(f"--lora-modules {text!r}: expected a JSON object")
    unknown = sorted(set(spec) - _MODULE_KEYS)
    if unknown:
        raise ValueError(f"--lora-modules {text!r}: unknown key(s) {', '.join(unknown)} (known: name, path, digest)")
    name, path, digest = spec.get("name"), spec.get("path"), spec.get("digest")
    for key, value in (("name", name), ("path", path)):
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"--lora-modules {text!r}: '{key}' must be a non-empty string")
    if digest is not None and not (isinstance(digest, str) and DIGEST_RE.match(digest)):
        raise ValueError(f"--lora-modules adapter {name!r}: malformed digest {digest!r}: expected 'sha256:' and 64 hex digits")
    return LoRAModule(name.strip(), path.strip(), digest)


def lora_modules(args: argparse.Namespace) -> list[LoRAModule]:
    """The --lora-modules adapters, checked: each well formed, names unique and not the base model's, and
    only with --enable-lora. Raises FlagError."""
    texts: Sequence[str] = getattr(args, "lora_modules", None) or []
    if texts and not args.enable_lora:
        raise FlagError("lora_modules", "--lora-modules needs --enable-lora")
    modules: list[LoRAModule] = []
    for text in texts:
        try:
            module = parse_lora_module(text)
        except ValueError as exc:
            raise FlagError("lora_modules", str(exc)) from None
        if any(m.name == module.name for m in modules):
            raise FlagError("lora_modules", f"--lora-modules names adapter {module.name!r} twice")
        if module.name in (args.served_model_name or args.model, args.model):
            raise FlagError("lora_modules", f"--lora-modules adapter {module.name!r} has the base model's name")
        modules.append(module)
    return modules


def _lora_config(args: argparse.Namespace) -> dict[str, Any]:
    """The engine's LoRA settings, checked; none without --enable-lora (vLLM builds no LoRA config then)."""
    if not args.enable_lora:
        return {}
    for dest in ("max_loras", "max_lora_rank"):
        if getattr(args, dest) < 1:
            raise FlagError(dest, f"--{dest.replace('_', '-')} must be >= 1, got {getattr(args, dest)}")
    if args.max_cpu_loras is not None and args.max_cpu_loras < args.max_loras:
        raise FlagError(
            "max_cpu_loras", f"--max-cpu-loras ({args.max_cpu_loras}) must be >= --max-loras ({args.max_loras})"
        )
    return {"enable_lora": True, "max_loras": args.max_loras, "max_lora_rank": args.max_lora_rank,
            "max_cpu_loras": args.max_cpu_loras}  # fmt: skip


class FlagError(ValueError):
    """A flag value `folio serve` refuses; ``dest`` is the argparse destination (``max_num_seqs``)."""

    def __init__(self, dest: str, message: str) -> None:
        super().__init__(message)
        self.dest = dest


# server flags and their lower bounds (engine flags are checked by EngineConfig)
_SERVER_MINIMUMS = {"max_n": 1, "max_queued_requests": 1, "max_request_body_bytes": 1, "max_sequences_per_request": 1}


def check(args: argparse.Namespace) -> tuple[EngineConfig, Faults]:
    """Every check `folio serve` makes of its flags before loading anything; the operator and `folio up`
    run the same on a spec's engine args at plan time. Raises FlagError naming the flag."""
    from folio.engine.config import ConfigValueError, EngineConfig
    from folio.engine.server.admission import Faults

    for dest, minimum in _SERVER_MINIMUMS.items():
        if getattr(args, dest) < minimum:
            raise FlagError(dest, f"--{dest.replace('_', '-')} must be >= {minimum}, got {getattr(args, dest)}")
    for dest in ("header_timeout", "body_timeout"):
        if not getattr(args, dest) > 0:
            raise FlagError(dest, f"--{dest.replace('_', '-')} must be > 0, got {getattr(args, dest)}")
    if not 0 <= args.metrics_port <= 65535:
        raise FlagError("metrics_port", f"--metrics-port must be 0 (off) or a port, got {args.metrics_port}")
    if args.metrics_port and args.metrics_port == args.port:
        raise FlagError("metrics_port", f"--metrics-port must differ from --port, got {args.metrics_port} for both")
    if not args.shutdown_timeout >= 0:
        raise FlagError("shutdown_timeout", f"--shutdown-timeout must be >= 0, got {args.shutdown_timeout}")
    for dest, field in (("fault_error_rate", "error_rate"), ("fault_latency_ms", "latency_ms"),
                        ("fault_crash_after_tokens", "crash_after_tokens")):
        try:
            Faults(**{field: getattr(args, dest)})
        except ValueError as exc:
            raise FlagError(dest, str(exc)) from exc
    faults = Faults(error_rate=args.fault_error_rate, latency_ms=args.fault_latency_ms,
                    crash_after_tokens=args.fault_crash_after_tokens)
    if args.headless and not args.node_rank:
        raise FlagError("headless", "--headless is for node ranks above 0: node rank 0 runs rank 0, which serves the API")
    lora_modules(args)
    lora = _lora_config(args)
    try:
        config = EngineConfig(
            model=args.model,
            dtype=args.dtype,
            device=args.device,
            max_model_len=args.max_model_len,
            block_size=args.block_size,
            kv_cache_memory_gib=args.kv_cache_memory_gib,
            gpu_memory_utilization=args.gpu_memory_utilization,
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens,
            enable_prefix_caching=args.enable_prefix_caching,
            enable_chunked_prefill=args.enable_chunked_prefill,
            digest=args.digest,
            seed=args.seed,
            enforce_eager=args.enforce_eager,
            structured_outputs_backend=args.structured_outputs_backend,
            scheduling_policy=args.scheduling_policy,
            tokenizer=args.tokenizer,
            fault_logit_noise=args.fault_logit_noise,
            tensor_parallel_size=args.tensor_parallel_size,
            pipeline_parallel_size=args.pipeline_parallel_size,
            nnodes=args.nnodes,
            node_rank=args.node_rank or 0,
            master_addr=args.master_addr or "127.0.0.1",
            master_port=args.master_port,
            rendezvous_timeout=args.rendezvous_timeout,
            collective_timeout=args.collective_timeout,
            speculative_config=args.speculative_config,
            **lora,
        )
    except ConfigValueError as exc:
        raise FlagError(exc.field, str(exc)) from exc
    return config, faults


class LoRAModuleError(RuntimeError):
    """A --lora-modules adapter the engine refused at start-up (the engine is closed)."""


def build_engine(config: EngineConfig, loras: Sequence[LoRAModule] = ()) -> LLMEngine:
    """``LLMEngine(config)`` with the --lora-modules adapters loaded (ids 1, 2, … in order), built on a
    thread of its own that ends once it is built; raises LoRAModuleError naming a refused adapter.

    Loading and the profiling step run torch's parallel ops, and OpenMP (libgomp) keeps a pool of worker
    threads for each thread that has run one, for as long as that thread lives. The server steps the engine
    on its engine thread; were the main thread's pool alive beside that one, libgomp would count more of
    its threads than CPUs and cut their spin-waits to a few spins, so that each op of a step waits for its
    workers to wake: decode steps inside `folio serve` took 30.6 ms against 21.0 built this way
    (bench/README.md). A pool ends with its thread.
    """
    from folio.engine.llm_engine import LLMEngine

    with concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="folio-load") as loader:
        engine = loader.submit(LLMEngine, config).result()
        if loras:
            loader.submit(_add_loras, engine, loras).result()
        return engine


def _add_loras(engine: LLMEngine, modules: Sequence[LoRAModule]) -> None:
    from folio.engine.lora import LoRAError, LoRARequest

    for int_id, m in enumerate(modules, start=1):
        try:
            engine.add_lora(LoRARequest(m.name, int_id, m.path, digest=m.digest))
        except (LoRAError, OSError, ValueError) as exc:
            engine.close()
            raise LoRAModuleError(f"cannot load LoRA adapter {m.name!r} (--lora-modules) from {m.path}: {exc}") from exc


def freeze_start_up_objects() -> int:
    """Moves every object alive now out of the garbage collector's reach (`gc.freeze`); returns how many.

    What start-up built (the model's modules, the tokenizer, transformers' and FastAPI's machinery: hundreds
    of thousands of objects) lives as long as the server. Left in the oldest generation, every full
    collection rescans all of it, a pause of well over 100 ms on the development machine that lands mid-request
    in some TTFT or TPOT (bench/README.md); frozen, collections see only what serving creates. The
    collection first frees what start-up left as garbage, so none of it is kept.
    """
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def _resolve_model(args: argparse.Namespace) -> None:
    """A pkg:// model becomes the path it is installed at; the URL stays the default served name."""
    from folio.engine.package_files import SCHEME, PackageFileError, local_path

    if args.model.startswith(SCHEME):
        try:
            path = local_path(args.model)
        except PackageFileError as exc:
            raise FlagError("model", str(exc)) from None
        args.served_model_name, args.model = args.served_model_name or args.model, path


def tool_call_parser(args: argparse.Namespace, model_config: Any) -> str | None:
    """The parser "auto" tool choice reads answers with: --tool-call-parser, else the model family's; None
    without --enable-auto-tool-choice. A FlagError when the family has no default and none is named."""
    from folio.engine.tools.parsers import parser_for

    if not args.enable_auto_tool_choice:
        return None
    model_type = getattr(getattr(model_config, "hf", None), "model_type", None)
    try:
        return parser_for(args.tool_call_parser, model_type).name
    except ValueError as exc:
        raise FlagError("tool_call_parser", f"--enable-auto-tool-choice: {exc}") from None


def node_from_env(args: argparse.Namespace, env: Mapping[str, str]) -> None:
    """A LeaderWorkerSet pod's place in its group, where the flags do not give it: the node rank from
    ``LWS_WORKER_INDEX``, node 0's address from ``LWS_LEADER_ADDRESS``; ``LWS_GROUP_SIZE`` must be --nnodes
    (a group of another size than the engine's plan would wait forever for ranks that never come)."""
    if args.node_rank is None and env.get("LWS_WORKER_INDEX"):
        args.node_rank = _env_int(env, "LWS_WORKER_INDEX", "node_rank")
    if args.master_addr is None and env.get("LWS_LEADER_ADDRESS"):
        args.master_addr = env["LWS_LEADER_ADDRESS"]
    if env.get("LWS_GROUP_SIZE"):
        size = _env_int(env, "LWS_GROUP_SIZE", "nnodes")
        if size != args.nnodes:
            raise FlagError("nnodes", f"--nnodes is {args.nnodes} but this pod's LeaderWorkerSet group has "
                            f"{size} pods (LWS_GROUP_SIZE)")  # fmt: skip


def _env_int(env: Mapping[str, str], name: str, dest: str) -> int:
    try:
        return int(env[name])
    except ValueError:
        raise FlagError(dest, f"{name} must be an integer, got {env[name]!r}") from None


def main(args: argparse.Namespace) -> int:
    import uvicorn

    from folio.engine.server.app import build_app, build_metrics_app
    from folio.engine.server.lifecycle import DrainingServer, MetricsServer
    from folio.engine.server.read_timeouts import ReadTimeouts, uvicorn_protocol
    from folio.engine.server.serving import ServingConfig

    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        _resolve_model(args)
        node_from_env(args, os.environ)
        config, faults = check(args)
        modules = lora_modules(args)
    except FlagError as exc:
        print(f"folio serve: {exc}", file=sys.stderr)
        return 2
    if config.node_rank > 0:  # another node's ranks: no API, no engine of its own (rank 0 schedules)
        from folio.engine.distributed.nodes import run_headless

        try:
            return run_headless(config)
        except (OSError, ValueError) as exc:
            print(f"folio serve: cannot load {args.model}: {exc}", file=sys.stderr)
            return 1

    try:
        engine = build_engine(config, modules)  # verifies the digest, loads the weights, sizes the KV cache
    except LoRAModuleError as exc:
        print(f"folio serve: {exc}", file=sys.stderr)
        return 1
    except (OSError, ValueError) as exc:
        print(f"folio serve: cannot load {args.model}: {exc}", file=sys.stderr)
        return 1

    try:
        parser = tool_call_parser(args, engine.model_config)
    except FlagError as exc:
        engine.close()
        print(f"folio serve: {exc}", file=sys.stderr)
        return 2
    served = ServingConfig(
        served_model_name=args.served_model_name or args.model,
        model_path=args.model,
        max_model_len=engine.model_config.max_model_len,
        max_n=args.max_n,
        max_queued_requests=args.max_queued_requests,
        max_sequences_per_request=args.max_sequences_per_request,
        max_request_body_bytes=args.max_request_body_bytes,
        enable_docs=args.enable_docs,
        revision=args.revision,
        digest=args.digest,
        enable_lora=args.enable_lora,
        max_loras=args.max_loras,
        allow_runtime_lora_updating=args.allow_runtime_lora_updating,
        fault_adapter_files=args.fault_adapter_files,
        tool_call_parser=parser,
    )
    app = build_app(engine, served, faults)
    freeze_start_up_objects()
    if engine.parallel is not None:  # a lost rank fails the engine: readiness off, answers, exit 1
        async_engine = app.state.server.engine
        engine.parallel.attach(async_engine.fail_from_thread, async_engine.metrics.registry, served.served_model_name)
    # uvicorn bounds idle keep-alive connections only: slow-loris clients are closed by this guard
    http = uvicorn_protocol(ReadTimeouts(header_s=args.header_timeout, body_s=args.body_timeout))
    # the API's server and the metrics port's alike
    common: dict[str, Any] = {"host": args.host, "log_level": args.log_level,
                              "access_log": args.log_level == "debug", "timeout_graceful_shutdown": 5, "http": http}
    uv_config = uvicorn.Config(app, port=args.port, **common)
    metrics = None
    if args.metrics_port:
        metrics_app = build_metrics_app(app.state.server.engine)
        metrics = MetricsServer(uvicorn.Config(metrics_app, port=args.metrics_port, lifespan="off", **common))
    server = DrainingServer(uv_config, app.state.server, args.shutdown_timeout, metrics)
    try:
        server.run()
    finally:
        engine.close()
    if not server.started:
        return 1  # e.g. the port was taken (uvicorn logged why)
    return 1 if server.engine_died else 0

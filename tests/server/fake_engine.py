"""A small engine that honours the engine-core contract (folio.engine.llm_engine.LLMEngine) without a
model: byte-level tokens, a scripted or seeded output, a real block budget. It makes the server's
fault, drain, backpressure and disconnect tests fast and exact."""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from folio.engine.lora import LoRAError, LoRARequest
from folio.engine.output_text import OutputText
from folio.engine.outputs import CompletionOutput, EngineStats, RequestOutput
from folio.engine.resume import Replay
from folio.engine.sampling_params import SamplingParams

BOS, EOS, OFFSET = 1, 2, 3  # ids 0..2 are special; byte b is token b + OFFSET
SCRIPT = "The quick brown fox jumps over the lazy dog, café. "


class FakeTokenizer:
    chat_template = "fake-chatml"

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return ([BOS] if add_special_tokens else []) + [b + OFFSET for b in text.encode()]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return bytes(i - OFFSET for i in ids if i >= OFFSET).decode(errors="ignore")

    def apply_chat_template(
        self, conversation: list[dict[str, Any]], tokenize: bool = False, add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
    ) -> str:
        if conversation[0]["role"] == "assistant":
            raise ValueError("conversations must not start with an assistant turn")
        text = "<s>" + (f"<tools>{json.dumps(tools)}\n" if tools else "")
        for m in conversation:  # calls and their answers as a tool-calling template writes them
            calls = "".join(f"<call>{json.dumps(c['function'])}" for c in m.get("tool_calls", ()))
            answers = f"<answers {m['tool_call_id']}>" if "tool_call_id" in m else ""
            text += f"<{m['role']}>{answers}{m['content']}{calls}\n"
        return text + ("<assistant>" if add_generation_prompt else "")


@dataclass
class _Seq:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    arrival: float
    rng: random.Random | None
    lora: LoRARequest | None = None
    out: list[int] = field(default_factory=list)
    blocks: int = 0
    first_token_time: float | None = None
    decoded_chars: int = 0  # of the output's text, already given to `text`
    text: OutputText = field(init=False)

    def __post_init__(self) -> None:
        self.text = OutputText(self.params.stop, self.params.include_stop_str_in_output)  # type: ignore[arg-type]


class FakeGrammars:
    """The engine's grammar compiler, as far as the server calls it: constraints compile to nothing here (a
    fake engine's tokens follow no grammar; tests/engine/test_structured.py runs the real one)."""

    def compile(self, params: Any) -> None:
        return None


class FakeEngine:
    """One token per running sequence per step; ``step_delay`` seconds per step."""

    def __init__(
        self,
        *,
        max_model_len: int = 256,
        block_size: int = 4,
        num_blocks: int = 256,
        max_num_seqs: int = 8,
        step_delay: float = 0.002,
        fail_at_step: int | None = None,
        enable_lora: bool = False,
        max_lora_rank: int = 16,
        script: str | None = None,
        scheduling_policy: str = "fcfs",
    ) -> None:
        """``script``: what every greedy answer says, then stops (as at an end-of-sequence token); without
        one, greedy answers repeat `SCRIPT` until their length."""
        self.tokenizer = FakeTokenizer()
        self.script = script
        self.model_config = SimpleNamespace(max_model_len=max_model_len, vocab_size=256 + OFFSET)
        self.config = SimpleNamespace(scheduling_policy=scheduling_policy)
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.max_num_seqs = max_num_seqs
        self.step_delay = step_delay
        self.fail_at_step = fail_at_step
        self.steps = 0
        self.waiting: list[_Seq] = []
        self.running: dict[str, _Seq] = {}
        self.aborted: list[str] = []  # running sequences aborted
        self.admitted: list[str] = []  # every sequence that ever left the waiting queue
        self.enable_lora = enable_lora
        self.max_lora_rank = max_lora_rank
        self.loras: dict[str, LoRARequest] = {}  # the registered adapters, by name
        self.lora_requests: dict[str, LoRARequest | None] = {}  # each added request's adapter
        self.priorities: dict[str, int] = {}  # each added request's priority
        self.closed = False
        self.grammars = FakeGrammars()

    # ---------------------------------------------------------------- contract

    def add_request(
        self, request_id: str, prompt: str | list[int], params: SamplingParams, group: str | None = None,
        resume: Replay | None = None, lora_request: LoRARequest | None = None, priority: int = 0,
    ) -> None:  # FIFO: fair queueing and priorities are the real scheduler's (tests/engine/test_scheduler.py)
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        if request_id in self.running or any(s.request_id == request_id for s in self.waiting):
            raise ValueError(f"duplicate request id {request_id!r}")
        limit = self.model_config.max_model_len
        if len(ids) + params.max_tokens > limit:
            raise ValueError(f"prompt ({len(ids)} tokens) + max_tokens ({params.max_tokens}) > {limit}")
        self._check_lora(lora_request)
        rng = None if params.temperature == 0 else random.Random(params.seed)
        seq = _Seq(request_id, ids, params, time.monotonic(), rng, lora_request)
        self.lora_requests[request_id] = lora_request
        self.priorities[request_id] = priority
        if resume is not None:  # a continuation: its tokens as already generated, its text state as replayed
            assert not resume.finished
            seq.out, seq.text = list(resume.token_ids), resume.text
            seq.decoded_chars = len(self.tokenizer.decode(seq.out))
        self.waiting.append(seq)

    def add_lora(self, request: LoRARequest) -> None:
        """As the engine: the folder must hold a peft adapter whose rank fits --max-lora-rank."""
        if not self.enable_lora:
            raise LoRAError("LoRA is not enabled")
        if request.lora_name in self.loras:
            raise LoRAError(f"adapter {request.lora_name!r} is already loaded")
        config = Path(request.lora_path) / "adapter_config.json"
        try:
            rank = int(json.loads(config.read_text())["r"])
        except (OSError, ValueError, KeyError) as exc:
            raise LoRAError(f"adapter {request.lora_name!r}: cannot read {config}: {exc}") from exc
        if rank > self.max_lora_rank:
            raise LoRAError(f"adapter {request.lora_name!r}: rank {rank} is above --max-lora-rank {self.max_lora_rank}")
        self.loras[request.lora_name] = request

    def close(self) -> None:
        self.closed = True

    def remove_lora(self, name: str) -> bool:
        return self.loras.pop(name, None) is not None  # running requests keep theirs and finish

    def list_loras(self) -> list[LoRARequest]:
        return list(self.loras.values())

    def lora_state(self) -> tuple[list[str], list[str]]:
        def names(seqs: list[_Seq]) -> list[str]:
            return [s.lora.lora_name for s in seqs if s.lora is not None]

        return names(list(self.running.values())), names(self.waiting)

    def lora_resident(self) -> list[str]:
        return sorted(self.loras)  # a fake holds every adapter in memory

    def _check_lora(self, lora: LoRARequest | None) -> None:
        if lora is not None and self.loras.get(lora.lora_name) != lora:
            raise LoRAError(f"adapter {lora.lora_name!r} (id {lora.lora_int_id}) is not loaded")

    def abort_request(self, request_id: str) -> None:
        self.waiting = [s for s in self.waiting if s.request_id != request_id]
        if self.running.pop(request_id, None) is not None:
            self.aborted.append(request_id)

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running)

    def step(self) -> list[RequestOutput]:
        self.steps += 1
        if self.fail_at_step is not None and self.steps >= self.fail_at_step:
            raise RuntimeError("injected engine failure")
        time.sleep(self.step_delay)
        while self.waiting and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            need = self._blocks(len(seq.prompt_ids) + 1)
            if self.used_blocks + need > self.num_blocks:
                break
            self.waiting.pop(0)
            self.admitted.append(seq.request_id)
            seq.blocks = need
            self.running[seq.request_id] = seq
        outputs = []
        now = time.monotonic()
        for seq in list(self.running.values()):
            seq.out.append(self._next_token(seq))
            seq.first_token_time = seq.first_token_time or now
            seq.blocks = self._blocks(len(seq.prompt_ids) + len(seq.out))
            outputs.append(self._output(seq))
            if outputs[-1].finished:
                del self.running[seq.request_id]
        return outputs

    def stats(self) -> EngineStats:
        return EngineStats(
            num_running=len(self.running),
            num_waiting=len(self.waiting),
            kv_cache_usage=self.used_blocks / self.num_blocks,
            num_preemptions_total=0,
            prefix_cache_queries_total=0,
            prefix_cache_hits_total=0,
        )

    # ---------------------------------------------------------------- helpers

    @property
    def used_blocks(self) -> int:
        return sum(s.blocks for s in self.running.values())

    def _blocks(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def _next_token(self, seq: _Seq) -> int:
        if seq.rng is None:
            script = (self.script or SCRIPT).encode()
            return script[len(seq.out) % len(script)] + OFFSET
        return seq.rng.choice(b"abcdefghijklmnopqrstuvwxyz ") + OFFSET

    def _output(self, seq: _Seq) -> RequestOutput:
        """As the engine does (vLLM's DELTA outputs, its own stop-string handling): the step's new token,
        and the text that is new since the last output and can no longer start a stop string."""
        p = seq.params
        text = self.tokenizer.decode(seq.out)  # byte tokens: a multi-byte character shows once complete
        stop = seq.text.add(text[seq.decoded_chars :])
        seq.decoded_chars = len(text)
        finish: str | None = None
        stop_reason: Any = None
        if stop is not None:
            finish, stop_reason = "stop", stop
        elif seq.rng is None and self.script is not None and len(seq.out) >= len(self.script.encode()):
            finish = "stop"
        elif len(seq.out) >= p.max_tokens:
            finish = "length"
        logprobs = None
        new = seq.out[-1]
        if p.logprobs is not None:
            logprobs = [{new: -0.25, (new + 1) % 256 + OFFSET: -1.5, BOS: -4.0}]
        delta = seq.text.take(finish is not None)
        out = RequestOutput(
            request_id=seq.request_id,
            prompt=None,
            prompt_token_ids=seq.prompt_ids,
            outputs=[CompletionOutput(0, delta, [new], finish, stop_reason, logprobs, None)],
            finished=finish is not None,
            arrival_time=seq.arrival,
            first_token_time=seq.first_token_time,
        )
        if len(seq.out) == 1:  # the prompt's logits come with the first output, as the engine's do
            if p.prompt_logprobs is not None:
                out.prompt_logprobs = [None, *({t: -1.0} for t in seq.prompt_ids[1:])]
            if p.mean_prompt_logits:  # the prompt's token histogram: equal prompts, equal "logits"
                import torch

                counts = torch.bincount(torch.tensor(seq.prompt_ids), minlength=self.model_config.vocab_size)
                out.prompt_logits_mean = counts.float() / len(seq.prompt_ids)
        return out

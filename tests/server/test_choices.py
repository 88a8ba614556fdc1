"""The renderer shared by completions and chat (`folio.engine.server.choices`): what each chunk carries,
and that the work per step stays the same however long a stream gets."""

from __future__ import annotations

from folio.engine.outputs import CompletionOutput, RequestOutput, merge_outputs
from folio.engine.sampling_params import SamplingParams
from folio.engine.server.async_engine import EngineRequest
from folio.engine.server.choices import Choices, Piece, Prompt
from folio.engine.server.protocol import Usage


def step(rid: str, text: str, tokens: list[int], finish: str | None = None) -> RequestOutput:
    logprobs = [{t: -0.5} for t in tokens]
    completion = CompletionOutput(0, text, tokens, finish, None, logprobs, None)
    return RequestOutput(rid, None, [1, 2, 3], [completion], finished=finish is not None)


class Recorder:
    """A renderer that keeps what it is handed."""

    def __init__(self) -> None:
        self.opened: list[int] = []
        self.pieces: list[Piece] = []

    def opening(self, index: int) -> list:
        self.opened.append(index)
        return []

    def chunks(self, piece: Piece) -> list:
        self.pieces.append(piece)
        return []

    def usage_chunk(self, usage: Usage) -> None: ...

    def response(self, pieces: list[Piece], usage: Usage) -> None: ...


def choices(n: int = 1, prompts: int = 1) -> tuple[Choices, list[str]]:
    seqs = [EngineRequest(f"r-{i}", [1, 2, 3], SamplingParams()) for i in range(n * prompts)]
    return Choices(seqs, [Prompt([1, 2, 3], "abc") for _ in range(prompts)], n), [s.request_id for s in seqs]


def test_per_step_work_does_not_grow_with_the_stream() -> None:
    chosen, [rid] = choices()
    renderer = Recorder()
    steps = 6000
    for i in range(steps):  # every third step brings a token but no text yet (half a character)
        text = "" if i % 3 == 0 else "é"
        list(chosen.stream(step(rid, text, [i], "length" if i == steps - 1 else None), renderer))
    handed = [len(p.text) + len(p.token_ids) + len(p.logprobs or ()) for p in renderer.pieces]
    assert len(handed) == steps * 2 // 3
    assert max(handed[-1000:]) == max(handed[:1000]) <= 5  # the same at the end as at the start
    assert [t for p in renderer.pieces for t in p.token_ids] == list(range(steps))  # each token once
    assert renderer.pieces[-1].text_offset == steps * 2 // 3 - 1
    assert chosen.usage.completion_tokens == steps


def test_tokens_without_text_go_with_the_next_chunk() -> None:
    chosen, [a, b] = choices(n=2)
    renderer = Recorder()
    for out in [step(a, "", [1]), step(b, "x", [9]), step(a, "ab", [2]), step(a, "", [3]), step(a, "c", [4], "stop"),
                step(b, "", [8], "length")]:  # fmt: skip
        list(chosen.stream(out, renderer))
    assert renderer.opened == [0, 1]  # each choice's stream opens at its first output, text or not
    got = [(p.index, p.text, p.token_ids, len(p.logprobs or ()), p.text_offset, p.first, p.finish_reason)
           for p in renderer.pieces]  # fmt: skip
    assert got == [
        (1, "x", [9], 1, 0, True, None),
        (0, "ab", [1, 2], 2, 0, True, None),
        (0, "c", [3, 4], 2, 2, False, "stop"),
        (1, "", [8], 1, 1, False, "length"),  # a finished choice always gets its last chunk
    ]
    assert chosen.usage == Usage(prompt_tokens=3, completion_tokens=6, total_tokens=9)


def test_whole_answers_and_usage_count_each_prompt_once() -> None:
    chosen, rids = choices(n=2, prompts=2)
    finals = {rid: merge_outputs([step(rid, "he", [1, 2]), step(rid, "y", [3], "stop")]) for rid in rids}
    pieces = chosen.whole(finals)
    assert [(p.index, p.text, p.token_ids, p.first, p.text_offset) for p in pieces] == [
        (i, "hey", [1, 2, 3], True, 0) for i in range(4)
    ]
    assert all(len(p.logprobs or ()) == 3 for p in pieces)
    assert chosen.usage == Usage(prompt_tokens=6, completion_tokens=12, total_tokens=18)

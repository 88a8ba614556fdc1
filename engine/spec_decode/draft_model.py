"""A draft model (vLLM's ``{"model": PATH, "num_speculative_tokens": K}``): a smaller model of the same
tokenizer proposes the next K tokens of each speculating sequence, greedily, with a paged KV cache of its own.

Each decoding sequence has a shadow here: a `Sequence` of the draft's own, whose K/V the draft's cache holds.
Before a step, `propose` brings every shadow up to its sequence (the tokens the draft has not seen yet: the
whole context the first time, then what the target kept and its own token) and runs the draft K times over
all of them together: one step for the new tokens and the first proposal, one step per further proposal. The
proposals the target refuses leave the shadow at the next `propose`, their blocks with them (`trim`).

The draft proposes its greedy choices: a deterministic proposer's ``q`` is one-hot, so the target's
verification (`rejection.verify`) is the same as prompt lookup's, exact at any temperature.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from folio.engine.block_manager import BlockManager
from folio.engine.config import ModelConfig
from folio.engine.loader import load_model, load_model_config
from folio.engine.model_runner import ModelRunner, kv_bytes_per_block
from folio.engine.sampling_params import SamplingParams
from folio.engine.scheduler import ScheduledSeq
from folio.engine.sequence import Sequence
from folio.engine.tokenizer.loading import load_tokenizer
from folio.engine.warmup import warm_up_kernels

_GREEDY = SamplingParams(temperature=0.0, max_tokens=1)


class DraftModelError(ValueError):
    """A draft model the target cannot use; the message names the draft and what differs."""


def check_vocabulary(draft_tokenizer: Any, target_tokenizer: Any, where: str) -> None:
    """Raise `DraftModelError` unless both tokenizers map the same tokens to the same ids: the target verifies
    the draft's token ids as its own. (Also the weights pre-pull's check, once both models are fetched.)"""
    theirs, ours = draft_tokenizer.get_vocab(), target_tokenizer.get_vocab()  # (each call builds a dict)
    if theirs != ours:
        differ = sum(1 for token, i in theirs.items() if ours.get(token) != i)
        raise DraftModelError(
            f"{where} has another vocabulary than the target's ({len(theirs)} tokens vs {len(ours)}, "
            f"{differ} of the draft's differ): a draft must share the target's tokenizer"
        )


class DraftModel:
    """The draft's weights (`load`), then its runner and cache (`start`), and the shadows of the sequences it
    proposes for."""

    cheap = False  # K forward passes of its own: it proposes only what a step's budget takes

    def __init__(self, path: str, model: Any, cfg: ModelConfig, dtype: torch.dtype, device: torch.device,
                 vocab_size: int) -> None:  # fmt: skip
        self.path, self.model, self.cfg = path, model, cfg
        self.dtype, self.device = dtype, device
        self.vocab_size = vocab_size  # the target's: a proposal past it ends the proposals
        self.runner: ModelRunner | None = None
        self.block_manager: BlockManager | None = None
        self.max_step_tokens = 0
        self._shadows: dict[int, _Shadow] = {}  # by id(sequence)

    @classmethod
    def load(cls, path: str, target: ModelConfig, target_tokenizer: Any, dtype: torch.dtype,
             device: torch.device) -> DraftModel:  # fmt: skip
        """The draft's weights, checked against the target: the same tokenizer (token to id), and a context
        as long as the target's ``max_model_len``."""
        where = f"--speculative-config: the draft model {path}"
        if not Path(path).exists():
            raise DraftModelError(f"{where} does not exist")
        cfg, _ = load_model_config(path)
        check_vocabulary(load_tokenizer(path), target_tokenizer, where)
        if cfg.max_position_embeddings < target.max_model_len:
            raise DraftModelError(
                f"{where} reads at most {cfg.max_position_embeddings} positions (max_position_embeddings), fewer "
                f"than the target's max_model_len {target.max_model_len}: lower --max-model-len or use another draft"
            )
        cfg.max_model_len = target.max_model_len
        model = load_model(path, cfg, dtype, device, target.max_model_len)
        return cls(path, model, cfg, dtype, device, target.vocab_size)

    def block_bytes(self, block_size: int) -> int:
        """What the draft's cache costs per block of the target's (it holds as many tokens)."""
        return kv_bytes_per_block(self.cfg, block_size, self.dtype)

    def start(self, num_blocks: int, block_size: int, seed: int, *, max_num_seqs: int, max_step_tokens: int,
              enforce_eager: bool) -> None:  # fmt: skip
        """The draft's runner with a cache of ``num_blocks`` (the target's count: a draft never needs more
        blocks than its sequence holds in the target's cache)."""
        self.runner = ModelRunner(
            self.model, self.cfg, num_blocks, block_size, self.dtype, self.device, seed,
            max_num_seqs=max_num_seqs, enforce_eager=enforce_eager,
        )  # fmt: skip
        warm_up_kernels(self.runner, self.cfg.max_model_len)
        self.block_manager = BlockManager(num_blocks, block_size, enable_prefix_caching=False)
        self.max_step_tokens = max_step_tokens

    # --- proposing ------------------------------------------------------------------------------------

    @torch.inference_mode()
    def propose(self, seqs: list[Sequence], ks: list[int]) -> list[list[int]]:
        """Up to ``ks[i]`` tokens after ``seqs[i]``'s last: the draft's greedy continuation ([] for a sequence
        whose shadow finds no room in the draft's cache)."""
        assert self.runner is not None and self.block_manager is not None, "start() first"
        proposals: dict[int, list[int]] = {}
        todo: list[tuple[_Shadow, int]] = []
        for seq, k in zip(seqs, ks, strict=True):
            shadow = self._sync(seq)
            # K/V for the new tokens and all proposals but the last (which the draft never reads)
            if k > 0 and self.block_manager.allocate(shadow.seq, shadow.seq.num_uncomputed_tokens + k - 1):
                proposals[id(seq)] = shadow.proposed = []
                todo.append((shadow, k))
        while todo:
            budget, batch = self.max_step_tokens, []
            for shadow, _ in todo:
                n = min(shadow.seq.num_uncomputed_tokens, budget)
                if n <= 0:
                    break
                batch.append(ScheduledSeq(shadow.seq, n))
                budget -= n
            assert batch, "every shadow in the loop has a token to run"
            sampled, result = self.runner.step(batch)
            for item in batch:
                item.seq.num_computed_tokens += item.num_tokens
            if result is not None:
                shadows = {id(s.seq): s for s, _ in todo}
                for item, token in zip(sampled, result.token_ids, strict=True):
                    shadows[id(item.seq)].append(token, self.vocab_size)
            todo = [(s, k) for s, k in todo if len(s.proposed) < k and not s.ended]
        return [proposals.get(id(seq), []) for seq in seqs]

    def _sync(self, seq: Sequence) -> _Shadow:
        """``seq``'s shadow, holding its tokens now: the K/V the draft computed for proposals the target
        refused go, with their blocks."""
        assert self.block_manager is not None
        shadow = self._shadows.get(id(seq))
        if shadow is None:
            own = Sequence(seq.request_id, None, [], _GREEDY, seq.max_total_tokens, frozenset())
            shadow = self._shadows[id(seq)] = _Shadow(own)
        own, tokens = shadow.seq, seq.token_ids
        same = shadow.synced  # the target only appends: its tokens up to the last sync are the shadow's
        while same < min(len(own.token_ids), len(tokens)) and own.token_ids[same] == tokens[same]:
            same += 1
        own.token_ids[same:] = tokens[same:]
        # the last token is always run again: its logits (the first proposal) are not kept between steps
        own.num_computed_tokens = min(own.num_computed_tokens, same, len(tokens) - 1)
        self.block_manager.trim(own, own.num_computed_tokens)
        shadow.synced, shadow.ended = len(tokens), False
        return shadow

    def forget(self, seq: Sequence) -> None:
        """``seq`` finished or was preempted: its shadow's blocks go back."""
        shadow = self._shadows.pop(id(seq), None)
        if shadow is not None and self.block_manager is not None:
            self.block_manager.free(shadow.seq)

    def check(self) -> None:
        """The draft's cache invariants, and each shadow within its sequence's tokens (tests)."""
        assert self.block_manager is not None
        self.block_manager.check(s.seq for s in self._shadows.values())
        for shadow in self._shadows.values():
            assert shadow.seq.num_computed_tokens <= len(shadow.seq)


class _Shadow:
    def __init__(self, seq: Sequence) -> None:
        self.seq = seq  # the draft's: its token ids are the target's, then this step's proposals
        self.synced = 0  # the target's length when last synced
        self.proposed: list[int] = []
        self.ended = False  # the draft proposed a token outside the target's vocabulary

    def append(self, token: int, vocab_size: int) -> None:
        if token >= vocab_size:  # a padding row of a larger embedding: nothing the target can keep
            self.ended = True
            return
        self.seq.token_ids.append(token)
        self.proposed.append(token)

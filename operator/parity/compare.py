"""The parity verdict: how closely a canary's answers to a prompt suite match stable's. Pure.

Per prompt: the cosine similarity of the two revisions' mean prompt logits (the mean over the prompt's
positions of the full logit vector), whether the greedy continuations match token for token (and where
they first diverge), and whether the prompt's token ids match (a tokenizer or chat-template change shows
here instead of being hidden). Over the suite: mean and minimum cosine, the share of matching
continuations. ``Pass`` when the mean cosine reaches ``minCosine`` and the match share ``minTokenMatch``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from folio.operator.parity.suite import SuitePrompt
from folio.operator.spec import ParityPromptDiff, ParityReport, ParitySpec

WORST = 5  # prompts listed in the report and the Warning Event
TEXT_LIMIT = 60


@dataclass(frozen=True)
class ParityAnswer:
    """One revision's answer to one prompt (`POST /folio/v1/parity`, decoded)."""

    prompt_token_ids: list[int]
    mean_logits: np.ndarray  # float32 [vocab]
    token_ids: list[int]
    text: str


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine similarity in float64; vocabularies of different sizes compare over the ids both have."""
    n = min(a.shape[0], b.shape[0])
    x, y = a[:n].astype(np.float64), b[:n].astype(np.float64)
    norm = float(np.linalg.norm(x) * np.linalg.norm(y))
    if norm == 0.0:
        return 1.0 if not x.any() and not y.any() else 0.0
    return float(np.dot(x, y) / norm)


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first position where two token lists differ (a length difference counts); None if equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def compare(
    suite: Sequence[SuitePrompt],
    stable: Sequence[ParityAnswer],
    canary: Sequence[ParityAnswer],
    spec: ParitySpec,
    *,
    revision: str,
    stable_revision: str | None,
    at: str | None = None,
    seconds: float | None = None,
) -> ParityReport:
    assert len(suite) == len(stable) == len(canary) and suite, "one answer per prompt on each side"
    rows = []
    for i, (prompt, s, c) in enumerate(zip(suite, stable, canary, strict=True)):
        rows.append(
            ParityPromptDiff(
                index=i,
                prompt=prompt.summary(TEXT_LIMIT),
                cosine=cosine(s.mean_logits, c.mean_logits),
                prompt_tokens_differ=s.prompt_token_ids != c.prompt_token_ids,
                first_divergence=first_divergence(s.token_ids, c.token_ids),
                stable=_cut(s.text),
                canary=_cut(c.text),
            )
        )
    cosines = np.array([r.cosine for r in rows], dtype=np.float64)
    matches = sum(r.first_divergence is None for r in rows)
    mean_cos, min_cos, share = float(cosines.mean()), float(cosines.min()), matches / len(rows)
    passed = mean_cos >= spec.min_cosine and share >= spec.min_token_match
    # worst first: the lowest cosine, a diverging continuation before a matching one of equal cosine
    worst = sorted(rows, key=lambda r: (round(r.cosine or 0.0, 9), r.first_divergence is None, r.index))[:WORST]
    report = ParityReport(
        revision=revision,
        stable_revision=stable_revision,
        at=at,
        verdict="Pass" if passed else "Fail",
        prompts=len(rows),
        mean_cosine=mean_cos,
        min_cosine=min_cos,
        token_match=share,
        prompt_token_mismatches=sum(r.prompt_tokens_differ for r in rows),
        seconds=seconds,
        worst=worst,
    )
    if not passed:
        report.message = describe_figures(report, spec)
    return report


def describe_figures(report: ParityReport, spec: ParitySpec) -> str:
    """One line: the suite's figures against the thresholds (for Degraded and the Events)."""
    if report.verdict == "Error":
        return f"parity gate could not run: {report.message}"
    parts = [
        f"mean cosine {report.mean_cosine:.6f} (min {spec.min_cosine})",
        f"lowest {report.min_cosine:.6f}",
        f"token match {report.token_match:.1%} (min {spec.min_token_match:.1%})",
        f"{report.prompts} prompts",
    ]
    if report.prompt_token_mismatches:
        parts.append(f"{report.prompt_token_mismatches} tokenized differently (tokenizer or chat template changed)")
    return f"parity {report.verdict}: " + ", ".join(parts)


def describe_diff(report: ParityReport) -> str:
    """The worst prompts, for the Warning Event attached to a failed gate."""
    lines = []
    for w in report.worst:
        where = "continuations match" if w.first_divergence is None else f"diverge at token {w.first_divergence}"
        tokens = "; prompt tokens differ" if w.prompt_tokens_differ else ""
        lines.append(
            f"#{w.index} {w.prompt!r}: cosine {w.cosine:.6f}, {where}{tokens}; "
            f"stable {w.stable!r} vs canary {w.canary!r}"
        )
    return "worst prompts: " + " | ".join(lines)


def _cut(text: str) -> str:
    return text if len(text) <= TEXT_LIMIT else text[: TEXT_LIMIT - 1] + "…"

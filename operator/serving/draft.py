"""Speculative decoding's draft model in a revision: pinned in ``spec.draftModel``, pre-pulled beside the
revision's weights (`folio.operator.prepull.draft_weights_path`), and named to the engines by the operator.

``spec.engine.args.speculativeConfig`` says how to speculate (``num_speculative_tokens``) and leaves out
``model``: a path inside a pod is nothing anyone pinned. The operator adds the path the pre-pull filled
(`with_draft`) when it writes each engine's ``--speculative-config``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from folio.operator.spec import EngineArgValue, InferenceServiceSpec

ARG = "speculativeConfig"
PLANNED = "(the pre-pulled draft model)"  # the path validation plans with: the real one depends on the revision


def with_draft(args: Mapping[str, EngineArgValue], path: str | None) -> dict[str, EngineArgValue]:
    """``args`` with the speculative config's ``model`` set to ``path`` (the draft's weights); unchanged
    without a draft, or when the config is no JSON object (validation reports that)."""
    config = _config(args)
    if path is None or config is None:
        return dict(args)
    return {**args, ARG: {**config, "model": path}}


def problems(spec: InferenceServiceSpec) -> list[tuple[str, str]]:
    """(field, message) for each way ``spec``'s draft model and speculative config disagree."""
    config = _config(spec.engine.args)
    where = f"spec.engine.args.{ARG}"
    if spec.draft_model is None:
        if config is not None and config.get("model") is not None:
            return [(where, "names a draft model by path, which nothing pins or pre-pulls: pin it in spec.draftModel "
                            "(source and revision or digest) and leave 'model' out")]  # fmt: skip
        if config is not None and config.get("method") is None:
            return [(where, "needs a method (\"ngram\") or a draft model, pinned in spec.draftModel")]
        return []
    if ARG not in spec.engine.args:
        return [("spec.draftModel", f"a draft model speculates only with {where} "
                                    '(e.g. {"num_speculative_tokens": 4})')]  # fmt: skip
    if config is None:
        return []  # not a JSON object: the engine args' own check says so
    if config.get("model") is not None:
        return [(where, "leaves 'model' out with spec.draftModel: the operator names the pre-pulled draft")]
    if config.get("method", "draft_model") != "draft_model":
        return [(where, f"method {config['method']!r} takes no draft model: remove spec.draftModel, or the method")]
    return []


def _config(args: Mapping[str, EngineArgValue]) -> dict[str, Any] | None:
    value = args.get(ARG)
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    return dict(value) if isinstance(value, dict) else None

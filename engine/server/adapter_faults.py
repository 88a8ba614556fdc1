"""A faulty adapter revision on purpose (``--fault-adapter-files``, a test aid like ``--fault-error-rate``).

An adapter folder holding `FAULT_FILE` (``{"errorRate": R}``) is an adapter whose requests fail: an engine
started with ``--fault-adapter-files`` answers each request under it with a 500 at rate R, while the base
model and every other adapter answer as usual. The file is part of the folder, so of its digest: a faulty
adapter is a revision of its own, which a rollout can roll back. Plain Python: the flag's help names the file.
"""

from __future__ import annotations

import json
from pathlib import Path

FAULT_FILE = "folio-fault.json"


def read_fault(folder: str | Path) -> float | None:
    """The error rate `FAULT_FILE` in ``folder`` asks for; None without the file. Raises ValueError for a file
    that does not say a rate in [0, 1]."""
    path = Path(folder) / FAULT_FILE
    if not path.is_file():
        return None
    try:
        rate = json.loads(path.read_text())["errorRate"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{FAULT_FILE} must hold {{\"errorRate\": R}}: {exc}") from None
    if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0.0 <= rate <= 1.0:
        raise ValueError(f"{FAULT_FILE}: errorRate must be a number in [0, 1], got {rate!r}")
    return float(rate)

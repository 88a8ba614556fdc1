"""`folio status NAME --tenants`: each tenant's usage over the last minute and hour, from the service's
routers (`folio.operator.router.usage`), local or in a cluster, as a table (the same for both)."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from folio.operator.router.usage import WINDOWS, Counts

COLUMNS = (("requests", "requests"), ("rate_limited", "429"), ("errors", "errors"),
           ("prompt_tokens", "prompt tokens"), ("completion_tokens", "completion tokens"))  # fmt: skip


def tenants_table(name: str, usage: dict[str, dict[str, Counts]], routers: int) -> Table:
    table = Table(title=f"{name}: tenants over the last minute / hour ({routers} router{'s' * (routers != 1)})",
                  title_justify="left")  # fmt: skip
    table.add_column("tenant")
    for _, label in COLUMNS:
        table.add_column(label, justify="right")
    for tenant, windows in usage.items():
        table.add_row(tenant, *(" / ".join(f"{windows[w][key]:,}" for w in WINDOWS) for key, _ in COLUMNS))
    if not usage:
        table.add_row("(no tenant has called yet, or spec.access is not set)", *([""] * len(COLUMNS)))
    return table


def local_usage(snap: dict[str, Any]) -> list[dict[str, Any]]:
    """The local `folio up`'s one router's usage."""
    import httpx

    from folio.operator.router.app import TENANTS_PATH

    resp = httpx.get(snap["router"] + TENANTS_PATH, timeout=10.0, trust_env=False)
    resp.raise_for_status()
    return [resp.json()["tenants"]]

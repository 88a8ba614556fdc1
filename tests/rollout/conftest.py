"""Rollout fixtures: the scenes most tests start from."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from tests.rollout.helpers import READY, Sim, deployed, make_spec


@dataclass
class Rollout:
    sim: Sim
    stable: str
    canary: str


def start_canary(sim: Sim, tag: str = "b") -> tuple[str, str]:
    """Apply a new revision to a serving ``sim``: it becomes the canary (no traffic yet)."""
    stable = sim.rev
    sim.apply(make_spec(tag))
    sim.tick(1)
    return stable, sim.rev


@pytest.fixture
def at_step_one() -> Rollout:
    """A stable revision serving and a ready canary at its first step (10% of traffic, a 1 min pause)."""
    sim = deployed()
    stable, canary = start_canary(sim)
    sim.facts[canary] = READY
    sim.tick(1)
    assert sim.weights() == {stable: 90, canary: 10}
    return Rollout(sim, stable, canary)

"""What `folio serve` does to the process at start-up: the engine built on a thread that ends, and what
start-up built frozen out of the garbage collector's reach (in a subprocess: a freeze is for the life of
the process)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import gc, weakref
    from folio.engine.serve_cli import freeze_start_up_objects

    class Node:
        pass

    kept = [Node() for _ in range(1000)]  # start-up state the server keeps
    a, b = Node(), Node()  # start-up garbage: a cycle no one references
    a.other, b.other = b, a
    dead = weakref.ref(a)
    del a, b
    frozen = freeze_start_up_objects()
    assert frozen == gc.get_freeze_count() > 1000, frozen
    assert dead() is None, "the garbage was collected, not frozen"
    assert all(gc.is_tracked(n) for n in kept)
    # a full collection now sees only what was made after the freeze
    assert len(gc.get_objects(generation=2)) < 100, len(gc.get_objects(generation=2))
    print("ok")
""")


def test_start_up_objects_are_frozen_and_start_up_garbage_freed() -> None:
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_the_engine_is_built_on_a_thread_that_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    """`folio serve` builds its engine off the main thread, on a thread gone once it is built (OpenMP's pool
    of workers for the thread that loaded the model goes with it)."""
    import threading

    from folio.engine import llm_engine, serve_cli

    built_on: list[threading.Thread] = []

    class Engine:
        def __init__(self, config: object) -> None:
            built_on.append(threading.current_thread())

    monkeypatch.setattr(llm_engine, "LLMEngine", Engine)
    engine = serve_cli.build_engine(object())  # type: ignore[arg-type]
    assert isinstance(engine, Engine)
    assert built_on[0] is not threading.main_thread() and not built_on[0].is_alive()

    class Broken:
        def __init__(self, config: object) -> None:
            raise ValueError("no such model")

    monkeypatch.setattr(llm_engine, "LLMEngine", Broken)
    with pytest.raises(ValueError, match="no such model"):  # serve turns it into "cannot load"
        serve_cli.build_engine(object())  # type: ignore[arg-type]

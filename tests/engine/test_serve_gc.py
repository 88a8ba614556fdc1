"""`folio serve` freezes what start-up built out of the garbage collector's reach (in a subprocess: a freeze
is for the life of the process)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

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

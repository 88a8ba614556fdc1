"""Polling with a deadline: tests wait for the state they need, never for a fixed duration.

`wait_for` (threads, subprocesses) and `until` (asyncio) call ``condition`` until it returns something
truthy, which they return; past ``timeout`` seconds they fail the test naming what was awaited.
One implementation, `folio.operator.testing.wait`, shared with the `folio up` driver and the demo.
"""

from folio.operator.testing.wait import WaitTimeout, until, wait_for

__all__ = ["WaitTimeout", "until", "wait_for"]

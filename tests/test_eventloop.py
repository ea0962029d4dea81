"""app.client.eventloop.run: the load's result is returned, never formatted on the way."""

from __future__ import annotations

import pytest

from app.client import eventloop


class Loud:
    reprs = 0

    def __repr__(self) -> str:
        Loud.reprs += 1
        return "Loud()"


def test_run_returns_the_result_without_formatting_it() -> None:
    async def main() -> Loud:
        return Loud()

    # in the main thread the runner installs and then restores a SIGINT handler; on
    # Python 3.11 the restore formatted the main task, result included
    out = eventloop.run(main())
    assert isinstance(out, Loud)
    assert Loud.reprs == 0


def test_run_propagates_the_exception() -> None:
    async def main() -> None:
        raise KeyError("x")

    with pytest.raises(KeyError):
        eventloop.run(main())

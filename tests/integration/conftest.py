"""Per-test hygiene for the integration tests (the session fixtures are in tests/conftest.py)."""

import pytest

from tests.support.processes import kill_spawned


@pytest.fixture(autouse=True)
def no_drain_left():
    """A test that fails while a drain it started is held at a failpoint (or still running) would leave
    that drain writing into the tests after it, for up to the pause's cap: it is killed instead."""
    yield
    killed = kill_spawned()
    if killed:
        print(f"killed drains the test left running: {killed}")

"""Session-wide test configuration.

Services (PostgreSQL, later ZooKeeper) are started by fixtures in ``tests/_services.py``.  With
``CI=true`` or ``REQUIRE_SERVICES=1`` a missing service fails the test instead of skipping it.
Randomised tests print their seed; set ``PYMETAQ_SEED`` to replay one.

Markers: a test that starts a process or a service is marked ``integration`` — explicitly
(``pytestmark``) in modules that start brokers or child processes, automatically when it uses a
service fixture (:data:`SERVICE_FIXTURES`). ``tests._broker`` refuses to start a broker for a
test without the marker, so the marker cannot drift (``-m "not integration"`` runs the pure
tests only).
"""

from __future__ import annotations

import os
import random

import pytest

from tests import _helpers

pytest_plugins = ["tests._fixtures"]

REQUIRE_SERVICES = os.environ.get("REQUIRE_SERVICES") == "1" or os.environ.get("CI") == "true"


@pytest.fixture
def seed(request: pytest.FixtureRequest) -> int:
    """A per-test random seed, printed so a failure can be replayed with PYMETAQ_SEED."""
    value = int(os.environ.get("PYMETAQ_SEED") or random.SystemRandom().randrange(1 << 31))
    print(f"\n[seed] {request.node.nodeid}: PYMETAQ_SEED={value}")
    return value


#: fixtures that start a service (directly or through another fixture)
SERVICE_FIXTURES = frozenset({"pg_server", "pg_url", "zk_server", "zk_hosts"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if SERVICE_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)


def pytest_runtest_setup(item: pytest.Item) -> None:
    _helpers.set_current_test(item.nodeid, item.get_closest_marker("integration") is not None)


def pytest_runtest_teardown(item: pytest.Item) -> None:
    _helpers.set_current_test(None, False)

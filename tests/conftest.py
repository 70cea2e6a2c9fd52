"""Session-wide test configuration.

Services (PostgreSQL, later ZooKeeper) are started by fixtures in ``tests/_services.py``.  With
``CI=true`` or ``REQUIRE_SERVICES=1`` a missing service fails the test instead of skipping it.
Randomised tests print their seed; set ``PYMETAQ_SEED`` to replay one.
"""

from __future__ import annotations

import os
import random

import pytest

pytest_plugins = ["tests._fixtures"]

REQUIRE_SERVICES = os.environ.get("REQUIRE_SERVICES") == "1" or os.environ.get("CI") == "true"


@pytest.fixture
def seed(request: pytest.FixtureRequest) -> int:
    """A per-test random seed, printed so a failure can be replayed with PYMETAQ_SEED."""
    value = int(os.environ.get("PYMETAQ_SEED") or random.SystemRandom().randrange(1 << 31))
    print(f"\n[seed] {request.node.nodeid}: PYMETAQ_SEED={value}")
    return value

"""The test PKI (made once per session with ``openssl``: tests/security/_helpers.py)."""

from __future__ import annotations

import pytest

from tests.security._helpers import Pki, make_pki


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))

"""docs/security.md runs as written: its openssl commands make the PKI, its ``ini`` block is the
broker's configuration (ports swapped for free ones), its ``pymetaq server`` block starts a real
broker (the log line is compared), then every console, python and wire block runs against it
(through tests/test_docs.py's runner)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import _docs
from tests._broker import BrokerProcess
from tests.security._helpers import tls_port
from tests.test_docs import Fix, _run

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
PAGE = "docs/security.md"


def test_security_page_runs_as_written(tmp_path: Path) -> None:
    with BrokerProcess(tmp_path / "secure.ini", tmp_path) as broker:
        fix = Fix({})
        problems: list[str] = []
        ran = 0
        for block in _docs.blocks(ROOT / PAGE, PAGE):
            kind = _docs.kind(block)
            if block.lang == "ini":
                ini = block.text.replace("serverPort=8123", "serverPort=0")
                (tmp_path / "secure.ini").write_text(ini.replace("tlsPort=8443", "tlsPort=0"))
            elif kind == "console" and block.text.startswith("$ pymetaq server -f secure.ini"):
                broker.launch()
                tls = tls_port(broker)
                fix = Fix(
                    {
                        "127.0.0.1:8123": f"127.0.0.1:{broker.port}",
                        "localhost:8443": f"localhost:{tls}",
                        "127.0.0.1:8443": f"127.0.0.1:{tls}",
                    }
                )
                (want,) = _docs.console_commands(block)
                line = next(x for x in broker.log_text().splitlines() if "listening on" in x)
                assert _docs.matches(fix(want.expected), line), (want.expected, line)
            elif kind in ("console", "python", "wire"):
                problems += _run(block, broker, fix)
            else:
                assert kind == "not-run", f"{block.where}: {kind}"
                continue
            ran += 1
        log = broker.log_text()
    assert not problems, "\n\n".join(problems) + "\n\nbroker log:\n" + log[-3000:]
    assert ran >= 10 and broker.port
    assert "alice-secret" not in log and "ops-secret" not in log

"""Test certificates made with the ``openssl`` binary, and brokers with a ``[security]`` section.

``openssl`` rather than the ``cryptography`` package: it is what docs/security.md tells an
operator to run, so the tests exercise the very commands the page documents, and it adds no
Python dependency.  ``make_pki(dir)`` writes a CA, a server certificate for ``localhost`` /
``127.0.0.1``, client certificates (``alice``, an expired one, one from another CA).
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests._broker import BrokerProcess

_TLS = re.compile(r"TLS on ([^\s:]+):(\d+)")
_EC = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]


def _run(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _ca(d: Path, name: str) -> None:
    _run(
        "req",
        "-x509",
        *_EC,
        "-keyout",
        f"{name}.key",
        "-out",
        f"{name}.pem",
        "-days",
        "30",
        "-subj",
        f"/CN={name}",
        cwd=d,
    )


def _leaf(d: Path, name: str, ca: str, *, days: int = 30, san: str = "") -> None:
    _run(
        "req", *_EC, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=d
    )
    ext = d / f"{name}.ext"
    ext.write_text(f"subjectAltName={san}\n" if san else "basicConstraints=CA:FALSE\n")
    _run(
        "x509",
        "-req",
        "-in",
        f"{name}.csr",
        "-CA",
        f"{ca}.pem",
        "-CAkey",
        f"{ca}.key",
        "-CAcreateserial",
        "-out",
        f"{name}.pem",
        "-days",
        str(days),
        "-extfile",
        ext.name,
        cwd=d,
    )


@dataclass(frozen=True)
class Pki:
    dir: Path

    def pem(self, name: str) -> str:
        return str(self.dir / f"{name}.pem")

    def key(self, name: str) -> str:
        return str(self.dir / f"{name}.key")


def make_pki(d: Path) -> Pki:
    d.mkdir(parents=True, exist_ok=True)
    _ca(d, "ca")
    _ca(d, "other-ca")
    _leaf(d, "localhost", "ca", san="DNS:localhost,IP:127.0.0.1")
    _leaf(d, "wronghost", "ca", san="DNS:broker.example.com")
    _leaf(d, "alice", "ca")
    _leaf(d, "bob", "ca")
    _leaf(d, "carol", "ca")
    _leaf(d, "ops", "ca")
    _leaf(d, "expired", "ca", days=-1)
    _leaf(d, "mallory", "other-ca")
    return Pki(d)


def security_ini(
    data: Path, security: dict[str, Any], extra: str = "", topics: str = "[topic=test]\n"
) -> str:
    lines = "".join(f"{k}={v}\n" for k, v in security.items())
    return (
        "[system]\nbrokerId=0\nserverPort=0\nnumPartitions=1\nunflushThreshold=0\n"
        f"dashboardHttpPort=0\ndataPath={data}\n\n[zookeeper]\nzk.zkEnable=false\n\n"
        f"[security]\n{lines}\n{extra}\n{topics}"
    )


def tls_port(broker: BrokerProcess) -> int:
    match = _TLS.search(broker.log_text())
    if match is None:
        raise AssertionError(f"the broker logged no TLS listener:\n{broker.log_text()}")
    return int(match.group(2))

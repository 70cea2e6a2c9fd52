"""The protected admin surface over HTTP(S): ``/metrics``, the dashboard and its reload need an
admin identity (Basic or a client certificate) once ``[security] enable=true``; HTTPS with the
broker's certificate; secrets redacted on ``/config``."""

from __future__ import annotations

import base64
import re
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from pymetaq.server.security.passwords import hash_password
from tests._broker import BrokerProcess
from tests._helpers import free_port
from tests.security._helpers import Pki, security_ini

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def broker(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    base = tmp_path_factory.mktemp("httpbroker")
    sec = {
        "enable": "true",
        "httpTls": "true",
        "tlsCertFile": pki.pem("localhost"),
        "tlsKeyFile": pki.key("localhost"),
        "tlsCaFile": pki.pem("ca"),
        "tlsClientAuth": "optional",
        "authFailureLimit": "50",
    }
    users = (
        f"[user=ops]\npassword={hash_password('ops-pw', log_n=10)}\nadmin=true\n\n"
        f"[user=alice]\npassword={hash_password('alice-pw', log_n=10)}\npublish=*\n\n"
    )
    ini = security_ini(base / "data", sec, users).replace(
        "dashboardHttpPort=0", f"dashboardHttpPort={free_port()}"
    )
    with BrokerProcess.start(base, ini_text=ini) as b:
        yield b


def _get(
    broker: BrokerProcess,
    pki: Pki,
    path: str,
    user: str | None = None,
    password: str = "",
    cert: str | None = None,
    data: bytes | None = None,
) -> tuple[int, dict[str, str], bytes]:
    ctx = ssl.create_default_context(cafile=pki.pem("ca"))
    if cert is not None:
        ctx.load_cert_chain(pki.pem(cert), pki.key(cert))
    url = broker.http_url.replace("127.0.0.1", "localhost") + path.lstrip("/")
    req = urllib.request.Request(url, data=data)
    if user is not None:
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        req.add_header("Authorization", f"Basic {token}")
    opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=ctx), _NoRedirect())
    try:
        with opener.open(req, timeout=20) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


def test_https_and_basic_auth_on_metrics(broker: BrokerProcess, pki: Pki) -> None:
    assert broker.http_url.startswith("https://")
    code, headers, body = _get(broker, pki, "/metrics")
    assert code == 401 and headers["WWW-Authenticate"].startswith('Basic realm="pymetaq"')
    assert _get(broker, pki, "/metrics", "ops", "wrong")[::2] == (401, b"authentication failed\n")
    assert _get(broker, pki, "/metrics", "nobody", "x")[::2] == (401, b"authentication failed\n")
    code, _, body = _get(broker, pki, "/metrics", "alice", "alice-pw")
    assert (code, body) == (403, b"identity 'alice' may not run admin commands\n")
    code, _, body = _get(broker, pki, "/metrics", "ops", "ops-pw")
    assert code == 200 and b"# TYPE" in body


def test_client_certificate_identity_on_https(broker: BrokerProcess, pki: Pki) -> None:
    assert _get(broker, pki, "/api/overview", cert="ops")[0] == 200
    # a certificate without a [user=...] section is not an admin: Basic is asked for
    assert _get(broker, pki, "/api/overview", cert="carol")[0] == 401


def test_config_page_redacts_and_reload_needs_admin(broker: BrokerProcess, pki: Pki) -> None:
    code, _, page = _get(broker, pki, "/config", "ops", "ops-pw")
    assert code == 200
    text = page.decode()
    assert "password=&lt;redacted&gt;" in text or "password=<redacted>" in text
    assert "scrypt$" not in text
    token = re.search(r'name="token" value="([^"]+)"', text)
    assert token is not None
    form = f"token={token.group(1)}".encode()
    assert _get(broker, pki, "/reload-config", data=form)[0] == 401
    assert _get(broker, pki, "/reload-config", "alice", "alice-pw", data=form)[0] == 403
    assert _get(broker, pki, "/reload-config", "ops", "ops-pw", data=form)[0] == 303
    assert "ops-pw" not in broker.log_text() and "alice-pw" not in broker.log_text()

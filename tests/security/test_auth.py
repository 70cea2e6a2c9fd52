"""Authentication and authorization against a real broker: ``auth PLAIN`` (the wire
extension), identities from client certificates, the authorization matrix (each verb x an
allowed and a denied identity, exact 403 texts), the anonymous path of plain MetaQ clients,
brute force locked out, secrets never in ``stats config`` or the log."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pymetaq.client import Consumer, Producer
from pymetaq.client.errors import AccessDenied, AuthenticationFailed
from pymetaq.client.protocol import (
    AdminCommand,
    LocalTxKey,
    ResultReply,
    TransactionCommand,
    TransactionType,
    TxAdminCommand,
    TxAdminOp,
    ValueReply,
    encode,
)
from pymetaq.client.protocol.txkey import format_tx_key
from pymetaq.offsets import FileOffsetStore
from pymetaq.server.security.passwords import hash_password
from tests._broker import BrokerProcess
from tests._helpers import wait_for
from tests.security._helpers import Pki, security_ini, tls_port
from tests.server._helpers import Wire, bput_frame, put_line

pytestmark = pytest.mark.integration

PASSWORDS = {"alice": "alice-pw", "bob": "bob-pw", "ops": "ops-pw"}
TOPICS = "".join(f"[topic={t}]\n" for t in ("orders", "logs.app", "public", "secret"))


def _users(log_n: int = 10) -> str:
    h = {u: hash_password(p, log_n=log_n) for u, p in PASSWORDS.items()}
    return (
        f"[user=alice]\npassword={h['alice']}\npublish=orders,logs.*\nsubscribe=orders\n"
        "groups=billing\n\n"
        f"[user=bob]\npassword={h['bob']}\nsubscribe=*\n\n"
        f"[user=ops]\npassword={h['ops']}\nadmin=true\n\n"
        "[user=carol]\npublish=public\nsubscribe=public\n\n"  # certificate only
        "[anonymous]\nsubscribe=public\n\n"
    )


@pytest.fixture(scope="module")
def broker(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    base = tmp_path_factory.mktemp("authbroker")
    sec = {
        "enable": "true",
        "tlsPort": "0",
        "tlsCertFile": pki.pem("localhost"),
        "tlsKeyFile": pki.key("localhost"),
        "tlsCaFile": pki.pem("ca"),
        "tlsClientAuth": "optional",
    }
    with BrokerProcess.start(
        base, ini_text=security_ini(base / "data", sec, _users(), TOPICS)
    ) as b:
        yield b


def _cb(r: object) -> tuple[int, bytes]:
    """(code, body) of a reply; a ``value`` reply counts as 200."""
    if isinstance(r, ResultReply):
        return r.code, r.body
    assert isinstance(r, ValueReply)
    return 200, r.data


def _auth(w: Wire, user: str, password: str, opaque: int = 1) -> tuple[int, bytes]:
    body = b"\0" + user.encode() + b"\0" + password.encode()
    r = w.call(b"auth PLAIN %d %d\r\n" % (len(body), opaque) + body)
    assert r.opaque == opaque
    return _cb(r)


def _login(broker: BrokerProcess, user: str | None) -> Wire:
    w = Wire(broker.address)
    if user is not None:
        assert _auth(w, user, PASSWORDS[user]) == (200, user.encode())
    return w


def _tx_begin() -> bytes:
    key = format_tx_key(LocalTxKey("s1", 1))
    return encode(TransactionCommand(key, "s1", TransactionType.BEGIN, opaque=9))


FRAMES: dict[str, bytes] = {
    "put orders": put_line("orders", 0, b"x", 9),
    "put secret": put_line("secret", 0, b"x", 9),
    "bput logs.app": bput_frame("logs.app", 0, [b"a", b"b"], 9),
    "get orders billing": b"get orders billing 0 0 1024 9\r\n",
    "get orders other": b"get orders other 0 0 1024 9\r\n",
    "get public g": b"get public g 0 0 1024 9\r\n",
    "offset orders billing": b"offset orders billing 0 0 9\r\n",
    "producers orders billing": b"producers orders billing 0 0 100 9\r\n",
    "producers orders other": b"producers orders other 0 0 100 9\r\n",
    "transaction begin": _tx_begin(),
    "stats": b"stats  9\r\n",
    "stats config": b"stats config 9\r\n",
    "stats reset": b"stats reset 9\r\n",
    "version": b"version 9\r\n",
    "admin closed": encode(AdminCommand("closed", (), 9)),
    "txadmin": encode(TxAdminCommand(TxAdminOp.FORGET, format_tx_key(LocalTxKey("s9", 1)), 9)),
    "sync": b"sync orders 0 1 0 5 9\r\nx",
    "bsync": b"bsync orders 0 1 1 -1 9\r\nx",
}


def _deny(who: str, what: str) -> bytes:
    tail = "; authenticate first" if who == "anonymous" else ""
    return f"identity '{who}' may not {what}{tail}".encode()


# (identity, frame, the exact 403 body or None = allowed)
MATRIX: list[tuple[str | None, str, bytes | None]] = [
    ("alice", "put orders", None),
    (None, "put orders", _deny("anonymous", "publish to topic 'orders'")),
    ("alice", "put secret", _deny("alice", "publish to topic 'secret'")),
    ("alice", "bput logs.app", None),
    ("bob", "bput logs.app", _deny("bob", "publish to topic 'logs.app'")),
    ("alice", "get orders billing", None),
    ("alice", "get orders other", _deny("alice", "use group 'other'")),
    ("ops", "get orders billing", _deny("ops", "subscribe to topic 'orders'")),
    (None, "get public g", None),
    (None, "get orders billing", _deny("anonymous", "subscribe to topic 'orders'")),
    ("bob", "offset orders billing", None),
    (None, "offset orders billing", _deny("anonymous", "subscribe to topic 'orders'")),
    ("alice", "producers orders billing", None),
    ("alice", "producers orders other", _deny("alice", "use group 'other'")),
    (None, "producers orders billing", _deny("anonymous", "subscribe to topic 'orders'")),
    ("alice", "transaction begin", None),
    ("bob", "transaction begin", _deny("bob", "run transactions")),
    (None, "stats", None),
    (None, "version", None),
    ("ops", "stats config", None),
    ("alice", "stats config", _deny("alice", "run admin commands")),
    ("ops", "stats reset", None),
    (None, "stats reset", _deny("anonymous", "run admin commands")),
    ("ops", "admin closed", None),
    ("bob", "admin closed", _deny("bob", "run admin commands")),
    ("ops", "txadmin", None),
    ("alice", "txadmin", _deny("alice", "run admin commands")),
    ("bob", "sync", _deny("bob", "run admin commands")),
    ("bob", "bsync", _deny("bob", "run admin commands")),
]


@pytest.mark.parametrize(("who", "frame", "denial"), MATRIX, ids=[f"{w}-{f}" for w, f, _ in MATRIX])
def test_authorization_matrix(
    broker: BrokerProcess, who: str | None, frame: str, denial: bytes | None
) -> None:
    with _login(broker, who) as w:
        code, body = _cb(w.call(FRAMES[frame]))
        if denial is None:
            assert code != 403, body
        else:
            assert (code, body) == (403, denial)
        assert w.call(b"version 77\r\n").opaque == 77  # the connection stays usable


def test_auth_replies(broker: BrokerProcess) -> None:
    with Wire(broker.address) as w:
        assert _auth(w, "alice", "wrong") == (401, b"authentication failed")
        assert _auth(w, "nobody", "x") == (401, b"authentication failed")  # same text
        assert _auth(w, "carol", "x") == (401, b"authentication failed")  # certificate-only
        r = w.call(b"auth SCRAM 2 3\r\nxx")
        assert _cb(r) == (400, b"unsupported auth mechanism 'SCRAM' (supported: PLAIN)")
        r = w.call(b"auth PLAIN 3 4\r\nabc")
        code, body = _cb(r)
        assert code == 400 and body.startswith(b"malformed PLAIN body")
        assert _auth(w, "bob", "bob-pw") == (200, b"bob")
        assert _auth(w, "alice", "alice-pw") == (400, b"already authenticated as 'bob'")
    # pipelined right behind auth: the put runs with the new identity
    with Wire(broker.address) as w:
        body = b"\0alice\0alice-pw"
        w.send(b"auth PLAIN %d 1\r\n" % len(body) + body + put_line("orders", 0, b"p", 2))
        assert w.reply().opaque == 1
        r = w.reply()
        assert (r.opaque, _cb(r)[0]) == (2, 200)


def test_clients_with_user_and_password(
    broker: BrokerProcess, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    url = f"meta://127.0.0.1:{broker.port}?user=alice"
    monkeypatch.setenv("PYMETAQ_PASSWORD", "alice-pw")
    with Producer(url) as p:
        assert p.send("orders", b"by-alice", raise_on_error=True).partition == 0
        with pytest.raises(
            AccessDenied, match="identity 'alice' may not publish to topic 'secret'"
        ):
            p.send("secret", b"no", raise_on_error=True)
    got: list[bytes] = []
    store = FileOffsetStore(tmp_path / "offsets.json")
    with Consumer(url, "billing", store, initial_position="earliest") as c:
        c.subscribe("orders")
        deadline = time.monotonic() + 30
        while b"by-alice" not in got and time.monotonic() < deadline:
            got += [m.value for m in c.poll(0.2)]
    assert b"by-alice" in got
    monkeypatch.setenv("PYMETAQ_PASSWORD", "wrong")
    with pytest.raises(AuthenticationFailed, match="authentication failed"):
        Producer(url)


def test_identity_from_client_certificate(broker: BrokerProcess, pki: Pki) -> None:
    port = tls_port(broker)
    url = f"meta+tls://localhost:{port}?ca={pki.pem('ca')}&cert={pki.pem('carol')}&key={pki.key('carol')}"
    with Producer(url) as p:
        p.send("public", b"by-carol", raise_on_error=True)
        with pytest.raises(
            AccessDenied, match="identity 'carol' may not publish to topic 'orders'"
        ):
            p.send("orders", b"no", raise_on_error=True)
    # a certificate without a [user=...] section gets the anonymous rights under its name
    url = (
        f"meta+tls://localhost:{port}?ca={pki.pem('ca')}&cert={pki.pem('bob')}&key={pki.key('bob')}"
    )
    with Producer(url) as p, pytest.raises(AccessDenied, match="identity 'bob' may not publish"):
        p.send("public", b"no", raise_on_error=True)


def test_plain_metaq_client_on_the_anonymous_path(broker: BrokerProcess) -> None:
    with Wire(broker.address) as w:  # MetaQ's wire forms, no auth: the [anonymous] rights
        r = w.call(b"put public 0 1 0 9\r\nx")
        assert _cb(r) == (403, _deny("anonymous", "publish to topic 'public'"))
        assert w.call(b"get public g 0 0 1024 10\r\n").opaque == 10


def test_secrets_never_in_stats_config_or_the_log(broker: BrokerProcess) -> None:
    with _login(broker, "ops") as w:
        r = w.call(b"stats config 5\r\n")
    text = _cb(r)[1].decode()
    assert "password=<redacted>" in text and "scrypt$" not in text
    assert "[user=alice]" in text
    log = broker.log_text()
    assert all(p not in log for p in PASSWORDS.values())
    assert "scrypt$" not in log
    assert "failed authentication as 'alice' from 127.0.0.1:" in log


def test_brute_force_is_locked_out(tmp_path: Path) -> None:
    sec = {"enable": "true", "authFailureLimit": "3", "authLockoutMs": "60000"}
    ini = security_ini(tmp_path / "data", sec, _users(), TOPICS)
    with BrokerProcess.start(tmp_path, ini_text=ini) as broker, Wire(broker.address) as w:
        for _ in range(3):
            assert _auth(w, "alice", "guess") == (401, b"authentication failed")
        code, body = _auth(w, "alice", "alice-pw")  # the right password, but locked out
        assert code == 401
        assert body.startswith(b"too many failed authentications from 127.0.0.1: retry in ")
        wait_for(
            lambda: (
                "the address is locked out" in broker.log_text()
                and "refused authentication from 127.0.0.1" in broker.log_text()
            ),
            10,
            "the lockout logged",
        )


def test_security_off_by_default_nothing_changes(tmp_path: Path) -> None:
    with BrokerProcess.start(tmp_path, topics={"t": {}}) as broker, Wire(broker.address) as w:
        assert _cb(w.call(b"put t 0 1 0 9\r\nx"))[0] == 200
        code, body = _cb(w.call(b"auth PLAIN 3 4\r\n\0a\0"))
        assert code == 400 and b"authentication is not enabled" in body

"""Pure checks: ``[security]``/``[user=...]`` validation with clear errors, password hashes,
rights patterns, redaction, and the client's ``meta+tls://`` options."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pymetaq.client.errors import (
    AccessDenied,
    AuthenticationFailed,
    PartitionClosed,
    error_for_reply,
)
from pymetaq.client.transport.security import client_security
from pymetaq.client.transport.servers import parse_servers
from pymetaq.server.config import parse_config
from pymetaq.server.errors import ConfigError
from pymetaq.server.security import passwords
from pymetaq.server.security.acl import Identity, Rights
from pymetaq.server.security.config import redact

BASE = "[system]\ndataPath=/tmp/x\n[topic=t]\n"
HASH = passwords.hash_password("pw", log_n=10, salt=b"0123456789abcdef")


def _cfg(extra: str) -> object:
    return parse_config(BASE + extra, "server.ini")


def test_default_config_has_security_off() -> None:
    cfg = parse_config(BASE, "server.ini")
    assert not cfg.security.enable and not cfg.security.tls  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            "[security]\nenabel=true\n",
            "unknown key 'enabel' in section [security]; did you mean 'enable'?",
        ),
        ("[security]\ntlsPort=8443\n", "TLS is on: tlsCertFile and tlsKeyFile are required"),
        (
            "[security]\ntlsPort=8443\ntlsOnServerPort=true\ntlsCertFile=a\ntlsKeyFile=b\n",
            "choose one",
        ),
        ("[security]\ntlsClientAuth=always\n", "expected none, optional or required"),
        ("[security]\ntlsClientAuth=required\n", "but no TLS listener"),
        (
            "[security]\ntlsPort=1\ntlsCertFile=/nonexistent.pem\ntlsKeyFile=/x\n",
            "cannot read the file",
        ),
        ("[user=alice]\npassword=plaintext\n", "bad value for 'password' in section [user=alice]"),
        ("[user=alice]\npublish=a/b\n", "'a/b' is not a topic or group name or pattern"),
        ("[user=alice]\nsubscrib=t\n", "unknown key 'subscrib' in section [user=alice]"),
        ("[anonymous]\npassword=x\n", "unknown key 'password' in section [anonymous]"),
        ("[user=anonymous]\n", "bad user name"),
        ("[secruity]\n", "unknown section [secruity]"),
    ],
)
def test_config_errors_name_the_line_and_key(extra: str, message: str) -> None:
    with pytest.raises(ConfigError, match=r"^server\.ini:\d+") as info:
        _cfg(extra)
    assert message in str(info.value)


def test_users_and_rights(tmp_path: Path) -> None:
    cfg = _cfg(
        f"[security]\nenable=true\n[user=alice]\npassword={HASH}\npublish=orders,logs.*\n"
        "groups=billing\n[anonymous]\nsubscribe=public\n"
    ).security  # type: ignore[attr-defined]
    alice = cfg.user("alice")
    assert alice is not None and alice.password_hash == HASH
    me = Identity("alice", alice.rights, "password")
    assert me.publish_denied("orders") is None and me.publish_denied("logs.app") is None
    assert me.publish_denied("logsXapp") == b"identity 'alice' may not publish to topic 'logsXapp'"
    assert me.subscribe_denied("orders", "billing") == (
        b"identity 'alice' may not subscribe to topic 'orders'"
    )
    anon = Identity("anonymous", cfg.anonymous)
    assert anon.subscribe_denied("public", "any") is None
    assert (
        anon.admin_denied()
        == b"identity 'anonymous' may not run admin commands; authenticate first"
    )
    assert Rights(publish="*").may_publish("anything") and not Rights().may_publish("x")


def test_password_hashes() -> None:
    assert passwords.verify(b"pw", HASH) and not passwords.verify(b"pW", HASH)
    assert passwords.hash_password("pw", log_n=10) != HASH  # a fresh salt each time
    assert not passwords.verify_unknown(b"pw")
    for bad in ("pw", "scrypt$14$8$1$!!$x", "scrypt$40$8$1$AAAAAAAAAAA=$AAAA"):
        with pytest.raises(passwords.BadHash):
            passwords.parse_hash(bad)


def test_redact_hides_every_password_value() -> None:
    text = f"[user=a]\npassword={HASH}\r\npublish=x\n[user=b]\n  password = y\n# password=z\n"
    out = redact(text)
    assert HASH not in out and "password = y" not in out and "=y" not in out
    assert out.count("<redacted>") == 2 and "publish=x" in out and "# password=z" in out


def test_client_security_options(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    url = f"meta+tls://h1:1,meta+tls://h2:2?ca={ca}&verify_hostname=false"
    assert parse_servers(url) == [("h1", 1), ("h2", 2)]
    sec = client_security(url)
    assert sec.tls and sec.ca_file == str(ca) and not sec.verify_hostname and not sec.user
    assert not client_security("meta://h:1").tls
    monkeypatch.setenv("PYMETAQ_PASSWORD", "s3cret")
    sec = client_security("meta://h:1?user=alice")
    assert (sec.user, sec.password, sec.auth_body()) == ("alice", "s3cret", b"\0alice\0s3cret")
    assert "s3cret" not in repr(sec)
    pw = tmp_path / "pw"
    pw.write_text("from-file\n")
    assert client_security(f"meta://h:1?user=bob&password_file={pw}").password == "from-file"
    for bad, why in [
        ("meta://a:1,meta+tls://b:2", "mixed meta:// and meta+tls://"),
        ("meta+tls://a:1?colour=red", "unknown server option 'colour'"),
        ("meta://a:1?ca=x", "TLS options need meta+tls://"),
        ("meta+tls://a:1?verify_hostname=maybe", "expected true or false"),
        ("meta+tls://a:1?ca=/nonexistent", "cannot read the file"),
    ]:
        with pytest.raises(ValueError, match=re.escape(why)):
            client_security(bad)
    monkeypatch.delenv("PYMETAQ_PASSWORD")
    with pytest.raises(ValueError, match="no password"):
        client_security("meta://h:1?user=alice")


def test_reply_codes_map_to_errors() -> None:
    assert isinstance(error_for_reply(401, b"authentication failed"), AuthenticationFailed)
    denied = error_for_reply(403, b"identity 'a' may not publish to topic 't'")
    assert isinstance(denied, AccessDenied) and not denied.retriable
    assert isinstance(error_for_reply(403, b"partition t-0 is closed"), PartitionClosed)

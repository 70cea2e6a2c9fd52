"""The ``[security]``, ``[user=NAME]`` and ``[anonymous]`` sections of ``server.ini``.

``[security]`` (all optional; without the section the broker behaves as MetaQ's):

| key               | default | meaning                                                     |
|-------------------|---------|-------------------------------------------------------------|
| enable            | false   | check every command against the identity's rights           |
| tlsPort           | -1      | a second listener speaking TLS (-1 = none, 0 = a free port) |
| tlsOnServerPort   | false   | ``serverPort`` itself speaks TLS (plain clients refused)    |
| tlsCertFile       |         | the broker's certificate chain (PEM)                        |
| tlsKeyFile        |         | its private key (PEM)                                       |
| tlsCaFile         |         | CAs that sign client certificates (PEM)                     |
| tlsClientAuth     | none    | ``none`` / ``optional`` / ``required`` client certificates  |
| httpTls           | false   | the HTTP port (``/metrics``, dashboard) speaks HTTPS with   |
|                   |         | the same certificate, key and client-certificate settings   |
| authFailureLimit  | 5       | failed ``auth`` attempts from one IP before it is locked out |
| authLockoutMs     | 60000   | how long a locked-out IP's attempts are refused unchecked   |

``[user=NAME]``: ``password`` (an scrypt hash from ``pymetaq security hash-password``; absent
= the identity can only come from a client certificate whose subject CN is NAME),
``publish``, ``subscribe``, ``groups`` (rights lists, see :mod:`.acl`) and ``admin`` (bool).
``[anonymous]``: the same keys but ``password``: the rights of a connection that has neither
a client certificate nor authenticated (none by default once ``enable=true``).

Validated at load: unknown keys, bad rights lists, malformed hashes, TLS without a certificate
or key, files that cannot be read - each a :class:`ConfigError` naming the file and line.

Thread-safe: immutable values.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from pymetaq.server.errors import ConfigError
from pymetaq.server.ini import IniSection, did_you_mean, eval_int, parse_bool
from pymetaq.server.security.acl import NO_RIGHTS, Rights, check_spec
from pymetaq.server.security.passwords import BadHash, parse_hash

CLIENT_AUTH = ("none", "optional", "required")

SECURITY_KEYS: dict[str, tuple[str, str, Any]] = {
    "enable": ("enable", "bool", False),
    "tlsPort": ("tls_port", "int", -1),
    "tlsOnServerPort": ("tls_on_server_port", "bool", False),
    "tlsCertFile": ("cert_file", "path", ""),
    "tlsKeyFile": ("key_file", "path", ""),
    "tlsCaFile": ("ca_file", "path", ""),
    "tlsClientAuth": ("client_auth", "str", "none"),
    "httpTls": ("http_tls", "bool", False),
    "authFailureLimit": ("auth_failure_limit", "int", 5),
    "authLockoutMs": ("auth_lockout_ms", "int", 60000),
}
RIGHTS_KEYS = ("publish", "subscribe", "groups", "admin")
#: keys whose values ``stats config`` never shows
SECRET_KEYS = frozenset({"password"})


@dataclass(frozen=True)
class UserConfig:
    name: str
    password_hash: str  # "" = certificate-only
    rights: Rights


@dataclass(frozen=True)
class SecurityConfig:
    enable: bool = False
    tls_port: int = -1
    tls_on_server_port: bool = False
    cert_file: str = ""
    key_file: str = ""
    ca_file: str = ""
    client_auth: str = "none"
    http_tls: bool = False
    auth_failure_limit: int = 5
    auth_lockout_ms: int = 60000
    users: tuple[UserConfig, ...] = ()
    anonymous: Rights = field(default=NO_RIGHTS)

    @property
    def tls(self) -> bool:
        """A TLS context is needed (a TLS broker listener or HTTPS)."""
        return self.tls_on_server_port or self.tls_port >= 0 or self.http_tls

    def user(self, name: str) -> UserConfig | None:
        for u in self.users:
            if u.name == name:
                return u
        return None


def parse_security(sections: tuple[IniSection, ...], path: str, base: str) -> SecurityConfig:
    """Build the :class:`SecurityConfig` from the parsed file (validated)."""
    values: dict[str, Any] = {}
    sec = next((s for s in sections if s.name == "security"), None)
    for entry in sec.entries if sec else ():
        spec = SECURITY_KEYS.get(entry.key)
        where = f"{path}:{entry.line}"
        if spec is None:
            hint = did_you_mean(entry.key, list(SECURITY_KEYS))
            raise ConfigError(f"{where}: unknown key '{entry.key}' in section [security]{hint}")
        attr, kind, _ = spec
        try:
            if kind == "bool":
                values[attr] = parse_bool(entry.value)
            elif kind == "int":
                values[attr] = eval_int(entry.value)
            elif kind == "path":
                values[attr] = _path(entry.value, base) if entry.value.strip() else ""
            else:
                values[attr] = entry.value.strip()
        except ValueError as exc:
            raise ConfigError(
                f"{where}: bad value for '{entry.key}' in section [security]: {exc}"
            ) from None
    users = tuple(_user(s, path) for s in sections if s.name.startswith("user="))
    anon = next((s for s in sections if s.name == "anonymous"), None)
    anonymous = _rights(anon, path, allow_password=False) if anon else NO_RIGHTS
    cfg = SecurityConfig(**values, users=users, anonymous=anonymous)
    _check(cfg, sec.line if sec else 0, path)
    return cfg


def _path(value: str, base: str) -> str:
    return os.path.normpath(os.path.join(base, os.path.expanduser(value.strip())))


def _check(cfg: SecurityConfig, line: int, path: str) -> None:
    where = f"{path}:{line}: [security]"
    if cfg.client_auth not in CLIENT_AUTH:
        raise ConfigError(
            f"{where} tlsClientAuth={cfg.client_auth!r}: expected none, optional or required"
        )
    if cfg.tls_port < -1 or cfg.tls_port > 65535:
        raise ConfigError(f"{where} tlsPort={cfg.tls_port}: expected -1 (none), 0 (any) or a port")
    if cfg.tls_on_server_port and cfg.tls_port >= 0:
        raise ConfigError(f"{where} tlsOnServerPort=true and tlsPort={cfg.tls_port}: choose one")
    if cfg.auth_failure_limit < 1 or cfg.auth_lockout_ms < 0:
        raise ConfigError(f"{where} authFailureLimit must be >= 1 and authLockoutMs >= 0")
    if cfg.tls:
        if not cfg.cert_file or not cfg.key_file:
            raise ConfigError(f"{where} TLS is on: tlsCertFile and tlsKeyFile are required")
        for key, value in (
            ("tlsCertFile", cfg.cert_file),
            ("tlsKeyFile", cfg.key_file),
            ("tlsCaFile", cfg.ca_file),
        ):
            if value and not os.access(value, os.R_OK):
                raise ConfigError(f"{where} {key}={value}: cannot read the file")
        if cfg.client_auth != "none" and not cfg.ca_file:
            raise ConfigError(f"{where} tlsClientAuth={cfg.client_auth} needs tlsCaFile")
    elif cfg.client_auth != "none":
        raise ConfigError(
            f"{where} tlsClientAuth={cfg.client_auth} but no TLS listener (tlsPort, httpTls)"
        )


def _user(section: IniSection, path: str) -> UserConfig:
    name = section.name[len("user=") :].strip()
    if not name or name == "anonymous" or any(c.isspace() or c == "\0" for c in name):
        raise ConfigError(f"{path}:{section.line}: bad user name in [{section.name}]")
    password = next((e for e in section.entries if e.key == "password"), None)
    if password is not None:
        try:
            parse_hash(password.value.strip())
        except BadHash as exc:
            raise ConfigError(
                f"{path}:{password.line}: bad value for 'password' in section "
                f"[{section.name}]: {exc}"
            ) from None
    rights = _rights(section, path, allow_password=True)
    return UserConfig(name, password.value.strip() if password else "", rights)


def _rights(section: IniSection, path: str, *, allow_password: bool) -> Rights:
    keys = RIGHTS_KEYS + (("password",) if allow_password else ())
    values: dict[str, Any] = {}
    for entry in section.entries:
        where = f"{path}:{entry.line}"
        if entry.key not in keys:
            hint = did_you_mean(entry.key, list(keys))
            raise ConfigError(
                f"{where}: unknown key '{entry.key}' in section [{section.name}]{hint}"
            )
        if entry.key == "password":
            continue
        if entry.key == "admin":
            try:
                values["admin"] = parse_bool(entry.value)
            except ValueError as exc:
                raise ConfigError(f"{where}: bad value for 'admin': {exc}") from None
            continue
        problem = check_spec(entry.value)
        if problem:
            raise ConfigError(
                f"{where}: bad value for '{entry.key}' in [{section.name}]: {problem}"
            )
        values[entry.key] = entry.value.strip()
    return Rights(**values)


def redact(text: str) -> str:
    """``server.ini`` text with every secret value replaced (for ``stats config``)."""
    out = []
    for raw in text.splitlines(keepends=True):
        key, sep, _ = raw.partition("=")
        if sep and key.strip() in SECRET_KEYS and not raw.lstrip().startswith(("#", ";", "[")):
            end = "\n" if raw.endswith("\n") else ""
            out.append(f"{key.rstrip()}=<redacted>{end}")
        else:
            out.append(raw)
    return "".join(out)

"""MetaQ's replication plugin files (``-F<plugin>=<file>``), parsed and checked.

``-Fmetaslave=async_slave.properties`` (MetaQ's ``metaslave`` plugin) makes a broker an
asynchronous slave of the master registered in ZooKeeper under the same ``brokerId``.  The
file is a Java properties file; its keys, exactly as MetaQ 1.4 reads them
(``SlaveConfig`` / ``MetaSlaveBroker``):

| key                    | default                      | meaning                                 |
|------------------------|------------------------------|-----------------------------------------|
| ``slaveId``            | (required, >= 0)             | this slave's number: ``slave<n>``,      |
|                        |                              | ``<brokerId>-s<n>`` in ZooKeeper        |
| ``slaveGroup``         | ``meta-slave-group_<slaveId>``| the group of its fetches on the master |
| ``slaveMaxDelayInMills``| 500                         | longest wait of one fetch for new data  |
| ``autoSyncMasterConfig``| false                       | copy the master's server.ini (``stats   |
|                        |                              | config``) when its checksum changes     |

Properties syntax (``java.util.Properties``): ``key=value``, ``key: value`` or ``key value``;
``#`` and ``!`` start comments; surrounding blanks are dropped.  An unknown key, a bad number or
a missing ``slaveId`` is an :class:`HaConfigError` naming the file, line and key, with a
did-you-mean hint (the broker turns it into its configuration error, exit code 2).

Thread-safety: pure functions and a frozen dataclass.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from dataclasses import dataclass
from pathlib import Path

SLAVE_KEYS = ("slaveId", "slaveGroup", "slaveMaxDelayInMills", "autoSyncMasterConfig")
#: MetaQ's group for a slave's fetches when ``slaveGroup`` is not set (``_<slaveId>`` appended)
DEFAULT_SLAVE_GROUP = "meta-slave-group"
#: the groups a master shows as its slaves in ``stats replication`` start with this
SLAVE_GROUP_PREFIX = DEFAULT_SLAVE_GROUP
PLUGINS = ("metaslave", "samsa", "gregor")
SAMSA_KEYS = (
    "slave",
    "sendToSlaveTimeoutInMills",
    "slaveContinuousFailureThreshold",
    "checkSlaveIntervalInMills",
    "recoverOffset",
    "callbackThreadCount",
    "recoverParallel",
    "recoverParallelHint",
)
_SEP = re.compile(r"\s*[=:]\s*|\s+")


class HaConfigError(ValueError):
    """A replication plugin option or file is invalid (the message says where and why)."""


@dataclass(frozen=True)
class SlaveConfig:
    """``async_slave.properties`` (see the module doc)."""

    slave_id: int
    slave_group: str
    max_delay_ms: int = 500
    auto_sync_master_config: bool = False
    path: str = ""


def parse_properties(text: str, source: str) -> dict[str, tuple[str, int]]:
    """``key -> (value, line number)`` of a Java properties text (no line continuations)."""
    out: dict[str, tuple[str, int]] = {}
    for no, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        parts = _SEP.split(line, maxsplit=1)
        key, value = parts[0], (parts[1].strip() if len(parts) > 1 else "")
        if not key:
            raise HaConfigError(f"{source}:{no}: a line without a key: {raw!r}")
        out[key] = (value, no)
    return out


def _int(source: str, key: str, value: str, no: int, lo: int, hi: int) -> int:
    try:
        n = int(value)
    except ValueError:
        raise HaConfigError(f"{source}:{no}: {key}={value!r} is not a whole number") from None
    if not lo <= n <= hi:
        raise HaConfigError(f"{source}:{no}: {key}={n} is outside {lo}..{hi}")
    return n


def parse_slave_config(text: str, source: str = "async_slave.properties") -> SlaveConfig:
    """Check an ``async_slave.properties`` text (see the module doc)."""
    props = parse_properties(text, source)
    for key, (_, no) in props.items():
        if key not in SLAVE_KEYS:
            close = difflib.get_close_matches(key, SLAVE_KEYS, n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]}?)" if close else f" (known: {', '.join(SLAVE_KEYS)})"
            raise HaConfigError(f"{source}:{no}: unknown key {key!r}{hint}")
    if "slaveId" not in props:
        raise HaConfigError(f"{source}: slaveId is required (this slave's number, 0 or more)")
    sid = _int(source, "slaveId", *props["slaveId"], 0, 1 << 20)
    group, gno = props.get("slaveGroup", (f"{DEFAULT_SLAVE_GROUP}_{sid}", 0))
    if not group or re.search(r"[\s/~!#$%^&*()+=`'\",;?\[\]<>.:]", group):
        raise HaConfigError(f"{source}:{gno}: slaveGroup={group!r} is not a valid group name")
    delay = 500
    if "slaveMaxDelayInMills" in props:
        delay = _int(source, "slaveMaxDelayInMills", *props["slaveMaxDelayInMills"], 1, 600_000)
    auto = False
    if "autoSyncMasterConfig" in props:
        value, no = props["autoSyncMasterConfig"]
        if value.lower() not in ("true", "false"):
            raise HaConfigError(f"{source}:{no}: autoSyncMasterConfig={value!r}: true or false")
        auto = value.lower() == "true"
    return SlaveConfig(sid, group, delay, auto, source)


@dataclass(frozen=True)
class SamsaConfig:
    """``samsa_master.properties``: the master of a synchronous pair (MetaQ's keys; the
    thread-pool keys ``callbackThreadCount``, ``recoverParallel``, ``recoverParallelHint`` are
    accepted and have no use here: one event loop does the work)."""

    slave_host: str
    slave_port: int
    send_timeout_ms: int = 2000
    failure_threshold: int = 100
    check_interval_ms: int = 100
    recover_offset: bool = False
    path: str = ""


def _bool(source: str, key: str, value: str, no: int) -> bool:
    if value.lower() not in ("true", "false"):
        raise HaConfigError(f"{source}:{no}: {key}={value!r}: true or false")
    return value.lower() == "true"


def _check_keys(props: dict[str, tuple[str, int]], known: tuple[str, ...], source: str) -> None:
    for key, (_, no) in props.items():
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]}?)" if close else f" (known: {', '.join(known)})"
            raise HaConfigError(f"{source}:{no}: unknown key {key!r}{hint}")


def parse_samsa_config(text: str, source: str = "samsa_master.properties") -> SamsaConfig:
    """Check a ``samsa_master.properties`` text."""
    props = parse_properties(text, source)
    _check_keys(props, SAMSA_KEYS, source)
    if "slave" not in props:
        raise HaConfigError(f"{source}: slave=host:port is required (the gregor slave's address)")
    value, no = props["slave"]
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise HaConfigError(f"{source}:{no}: slave={value!r} is not host:port")
    cfg = SamsaConfig(host.strip("[]"), int(port), path=source)
    ints = {
        "sendToSlaveTimeoutInMills": ("send_timeout_ms", 1, 3_600_000),
        "slaveContinuousFailureThreshold": ("failure_threshold", 1, 1 << 30),
        "checkSlaveIntervalInMills": ("check_interval_ms", 1, 3_600_000),
    }
    changes: dict[str, object] = {}
    for key, (field, lo, hi) in ints.items():
        if key in props:
            changes[field] = _int(source, key, *props[key], lo, hi)
    if "recoverOffset" in props:
        changes["recover_offset"] = _bool(source, "recoverOffset", *props["recoverOffset"])
    return dataclasses.replace(cfg, **changes)  # type: ignore[arg-type]


def parse_gregor_config(text: str, source: str = "gregor_slave.properties") -> None:
    """``gregor_slave.properties`` has no keys in MetaQ 1.4: anything but comments is refused."""
    props = parse_properties(text, source)
    _check_keys(props, (), source)


def parse_plugin_option(option: str) -> tuple[str, str]:
    """``metaslave=async_slave.properties`` -> (plugin, path); HaConfigError if malformed."""
    name, sep, path = option.partition("=")
    if not sep or not path:
        raise HaConfigError(
            f"-F{option}: expected -F<plugin>=<file>, e.g. -Fmetaslave=async_slave.properties"
        )
    if name not in PLUGINS:
        close = difflib.get_close_matches(name, PLUGINS, n=1, cutoff=0.5)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise HaConfigError(
            f"-F{option}: unknown plugin {name!r}{hint}; known: {', '.join(PLUGINS)}"
        )
    return name, path


def _read(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise HaConfigError(f"cannot read {path}: {e}") from e


def load_slave_config(path: str) -> SlaveConfig:
    """Read and check ``path`` (HaConfigError when unreadable or invalid)."""
    return parse_slave_config(_read(path), path)


@dataclass(frozen=True)
class Plugins:
    """What the ``-F`` options asked for (at most one role)."""

    metaslave: SlaveConfig | None = None
    samsa: SamsaConfig | None = None
    gregor: bool = False


def load_plugins(options: list[str]) -> Plugins:
    """The ``-F<plugin>=<file>`` options, each file read and checked; one role at most."""
    found: dict[str, object] = {}
    for option in options:
        name, path = parse_plugin_option(option)
        if name in found:
            raise HaConfigError(f"-F{option}: -F{name} given twice")
        text = _read(path)
        if name == "metaslave":
            found[name] = parse_slave_config(text, path)
        elif name == "samsa":
            found[name] = parse_samsa_config(text, path)
        else:
            parse_gregor_config(text, path)
            found[name] = True
    if len(found) > 1:
        raise HaConfigError(
            f"-F{' -F'.join(sorted(found))}: a broker has one role: metaslave, samsa or gregor"
        )
    return Plugins(**found)  # type: ignore[arg-type]


def _sections(text: str) -> list[tuple[str, list[str]]]:
    """(header, lines) per section of an ini text; the header of the lines before the first
    section is ``""``."""
    out: list[tuple[str, list[str]]] = [("", [])]
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("[") and stripped.endswith("]"):
            out.append((stripped[1:-1].strip(), [line]))
        else:
            out[-1][1].append(line)
    return out


def merge_master_topics(own: str, master: str) -> str:
    """``own`` server.ini with its ``[topic=...]`` sections replaced by the master's.

    ``autoSyncMasterConfig``: the slave takes the master's topics, and keeps its own
    ``[system]`` and ``[zookeeper]`` (its data path, port and host are its own)."""
    keep = [lines for name, lines in _sections(own) if not name.startswith("topic=")]
    topics = [lines for name, lines in _sections(master) if name.startswith("topic=")]
    parts = ["\n".join(lines).rstrip("\n") for lines in keep + topics]
    return "\n\n".join(p for p in parts if p.strip()) + "\n"

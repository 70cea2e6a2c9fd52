"""``pymetaq tail``'s configuration: a file in tail4j's INI layout (or the same sections in
TOML), or the command line's flags for one source.

```
[system]
checkpoint_path = /var/lib/pymetaq-tail     # one <checkpoint_name>.json per source
max_buf_size = 131072                       # bytes read at a time = the largest batch
poll_interval_ms = 100

[meta]
server_url = meta://127.0.0.1:8123          # or zk://host:port/root; --servers wins

[app]                                       # one section per source (any name)
topic = app-logs
log_base_path = /var/log/app                # a directory ...
log_name_regx = app\\.log                   # ... and a regex for the names (or whole paths)
paths = /var/log/web/*.log                  # and/or globs (comma- or newline-separated)
multiline_start = ^\\d{4}-\\d\\d-\\d\\d     # a record starts at a matching line
encoding = utf-8                            # re-encode lines from this charset to UTF-8
compress = false                            # true: lz4 batches
ordered = true                              # one partition per file
attributes = true                           # attribute host=...;file=... on each message
start_position = beginning                  # or end: where a file never seen before starts
timeout = 10000                             # ms per send request
checkpoint_name = app                       # default: the section's name
```

Unknown keys and sections are errors (:class:`ConfigError`, with the nearest known key);
``tmp_log_fullpath``, ``diamond_zk_data_id`` and ``diamond_zk_group`` (tail4j's sample) are
accepted and ignored.

Thread-safety: pure functions and frozen values.
"""

from __future__ import annotations

import configparser
import difflib
import os
import re
import tomllib
from dataclasses import dataclass, field
from typing import Any

SOURCE_KEYS = {
    "topic",
    "log_base_path",
    "log_name_regx",
    "paths",
    "multiline_start",
    "encoding",
    "compress",
    "ordered",
    "attributes",
    "start_position",
    "timeout",
    "checkpoint_name",
    "multiline_timeout",
}
SYSTEM_KEYS = {"checkpoint_path", "max_buf_size", "poll_interval_ms"}
META_KEYS = {"server_url"}
IGNORED_KEYS = {"tmp_log_fullpath", "diamond_zk_data_id", "diamond_zk_group", "test_path"}
DEFAULT_CHECKPOINT_DIR = "~/.pymetaq_tail"
DEFAULT_BUF = 128 * 1024


class ConfigError(ValueError):
    """A configuration a person must fix (the message names the file, section and key)."""


@dataclass(frozen=True)
class SourceConfig:
    """One source: files that go to one topic, with one checkpoint."""

    name: str
    topic: str
    globs: tuple[str, ...] = ()
    base_dir: str | None = None
    name_regex: str | None = None
    multiline_start: str | None = None
    encoding: str | None = None
    compress: bool = False
    ordered: bool = True
    attributes: bool = True
    start_at_end: bool = False
    timeout_ms: int = 10000
    multiline_timeout_s: float = 1.0
    checkpoint: str = ""


@dataclass(frozen=True)
class AgentConfig:
    sources: tuple[SourceConfig, ...]
    servers: str | None = None
    max_buf_size: int = DEFAULT_BUF
    poll_interval_s: float = 0.1
    extra: dict[str, str] = field(default_factory=dict)


def _bool(where: str, text: str) -> bool:
    t = text.strip().lower()
    if t in ("true", "yes", "on", "1"):
        return True
    if t in ("false", "no", "off", "0"):
        return False
    raise ConfigError(f"{where}: expected true or false, not {text!r}")


def _int(where: str, text: str, low: int = 0) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise ConfigError(f"{where}: not a whole number: {text!r}") from None
    if value < low:
        raise ConfigError(f"{where}: must be >= {low}, not {value}")
    return value


def _regex(where: str, text: str) -> str:
    try:
        re.compile(text)
    except re.error as e:
        raise ConfigError(f"{where}: bad regular expression {text!r}: {e}") from None
    return text


def _unknown(where: str, key: str, known: set[str]) -> ConfigError:
    near = difflib.get_close_matches(key, sorted(known), n=1)
    return ConfigError(
        f"{where}: unknown key {key!r}" + (f" (did you mean {near[0]!r}?)" if near else "")
    )


def _check_keys(where: str, values: dict[str, str], known: set[str]) -> None:
    for k in values:
        if k not in known and k not in IGNORED_KEYS:
            raise _unknown(where, k, known)


def source_from(name: str, values: dict[str, str], checkpoint_dir: str, where: str) -> SourceConfig:
    """One source section (values as strings)."""
    _check_keys(where, values, SOURCE_KEYS)
    topic = values.get("topic", "").strip()
    if not topic:
        raise ConfigError(f"{where}: no topic= (every source section names its topic)")
    globs = tuple(p.strip() for p in re.split(r"[,\n]", values.get("paths", "")) if p.strip())
    base = values.get("log_base_path", "").strip() or None
    regex = values.get("log_name_regx", "").strip() or None
    if regex is not None:
        _regex(f"{where} log_name_regx", regex)
        if base is None and "/" in regex:
            base = os.path.dirname(regex.replace("\\.", ".")) or None
    if not globs and base is None:
        raise ConfigError(f"{where}: no files: give paths= (globs) or log_base_path=")
    start = values.get("start_position", "beginning").strip().lower()
    if start not in ("beginning", "end"):
        raise ConfigError(f"{where} start_position: beginning or end, not {start!r}")
    ml = values.get("multiline_start", "").strip() or None
    if ml is not None:
        _regex(f"{where} multiline_start", ml)
    enc = values.get("encoding", "").strip() or None
    if enc is not None:
        try:
            "".encode(enc)
        except LookupError:
            raise ConfigError(f"{where} encoding: unknown charset {enc!r}") from None
        if enc.lower().replace("-", "").replace("_", "") in ("utf8", "ascii"):
            enc = None  # bytes are shipped as they are
    cp_name = values.get("checkpoint_name", "").strip() or name
    if "/" in cp_name or cp_name in (".", ".."):
        raise ConfigError(f"{where} checkpoint_name: a file name, not {cp_name!r}")
    return SourceConfig(
        name=name,
        topic=topic,
        globs=globs,
        base_dir=base,
        name_regex=regex,
        multiline_start=ml,
        encoding=enc,
        compress=_bool(f"{where} compress", values.get("compress", "false")),
        ordered=_bool(f"{where} ordered", values.get("ordered", "true")),
        attributes=_bool(f"{where} attributes", values.get("attributes", "true")),
        start_at_end=start == "end",
        timeout_ms=_int(f"{where} timeout", values.get("timeout", "10000"), 1),
        multiline_timeout_s=_int(
            f"{where} multiline_timeout", values.get("multiline_timeout", "1000"), 0
        )
        / 1000,
        checkpoint=os.path.join(os.path.expanduser(checkpoint_dir), cp_name + ".json"),
    )


def _as_strings(section: dict[str, Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in section.items():
        if isinstance(v, list):
            v = ",".join(str(x) for x in v)
        elif isinstance(v, bool):
            v = "true" if v else "false"
        out[k] = str(v)
    return out


def load_config(path: str) -> AgentConfig:
    """A config file: TOML when its name ends in ``.toml``, else INI (tail4j's layout)."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise ConfigError(f"cannot read {path}: {e.strerror}") from None
    sections: dict[str, dict[str, str]] = {}
    if path.endswith(".toml"):
        try:
            doc = tomllib.loads(raw.decode("utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
            raise ConfigError(f"{path}: not valid TOML: {e}") from None
        for name, sec in doc.items():
            if not isinstance(sec, dict):
                raise ConfigError(f"{path}: {name!r} must be a [section], not a top-level key")
            sections[name] = _as_strings(sec)
    else:
        cp = configparser.ConfigParser(interpolation=None, strict=True)
        cp.optionxform = str  # type: ignore[assignment,method-assign]
        try:
            cp.read_string(raw.decode("utf-8"), source=path)
        except (configparser.Error, UnicodeDecodeError) as e:
            raise ConfigError(f"{path}: not a valid INI file: {e}".replace("\n", " ")) from None
        sections = {s: dict(cp[s]) for s in cp.sections()}
    return config_from_sections(path, sections)


def config_from_sections(path: str, sections: dict[str, dict[str, str]]) -> AgentConfig:
    system = sections.pop("system", {})
    meta = sections.pop("meta", {})
    sections.pop("local_test", None)  # tail4j's sample carries it; nothing to do with it
    _check_keys(f"{path} [system]", system, SYSTEM_KEYS)
    _check_keys(f"{path} [meta]", meta, META_KEYS)
    cp_dir = system.get("checkpoint_path", "").strip() or DEFAULT_CHECKPOINT_DIR
    sources = tuple(
        source_from(name, values, cp_dir, f"{path} [{name}]") for name, values in sections.items()
    )
    if not sources:
        raise ConfigError(f"{path}: no source section (a [name] section with topic= and files)")
    checkpoints = [s.checkpoint for s in sources]
    if len(set(checkpoints)) != len(checkpoints):
        raise ConfigError(f"{path}: two sources share a checkpoint_name")
    return AgentConfig(
        sources=sources,
        servers=meta.get("server_url", "").strip() or None,
        max_buf_size=_int(
            f"{path} [system] max_buf_size", system.get("max_buf_size", str(DEFAULT_BUF)), 1024
        ),
        poll_interval_s=_int(
            f"{path} [system] poll_interval_ms", system.get("poll_interval_ms", "100"), 1
        )
        / 1000,
    )

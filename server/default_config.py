"""The packaged standalone configuration, ``server/default.ini`` (package data).

``pymetaq server``, ``pymetaq check`` and ``pymetaq repair`` without ``-f`` use it: a broker
on 127.0.0.1:8123, no ZooKeeper, data in ``./data`` (``dataPath=data``, resolved against the
working directory). ``pymetaq config --print`` writes it out to edit. The repository keeps the
same bytes as ``conf/server.ini``, the documented example (``tests/server/test_default_config.py``
keeps them identical).

Thread-safe: pure functions (the file is read on each call).
"""

from __future__ import annotations

from importlib import resources

from pymetaq.server.config import BrokerConfig, load_config, parse_config

#: the ``path`` a config loaded from the packaged default carries (in messages, ``stats``)
DEFAULT_PATH = "<the packaged default.ini>"


def default_text() -> str:
    """The packaged ``default.ini``, as text."""
    return resources.files("pymetaq.server").joinpath("default.ini").read_text(encoding="utf-8")


def load(path: str | None) -> BrokerConfig:
    """``path``'s configuration, or the packaged default for ``None`` (or :data:`DEFAULT_PATH`,
    so a broker started on the default reloads the default on SIGHUP)."""
    if path is None or path == DEFAULT_PATH:
        return parse_config(default_text(), DEFAULT_PATH)
    return load_config(path)


def file_option(config: BrokerConfig) -> str:
    """The ``-f`` option that names ``config`` again in a hint (empty for the default)."""
    return "" if config.path == DEFAULT_PATH else f" -f {config.path}"

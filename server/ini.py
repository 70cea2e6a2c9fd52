"""The low-level reader of MetaQ's ``server.ini``: sections, keys, values, line numbers.

MetaQ reads the file with ini4j and evaluates numbers and booleans with the Aviator expression
engine, so ``maxTransferSize=1024*1024`` is legal.  This module does the syntax only:

- ``[section]`` headers; ``key=value`` (or ``key: value``) lines; ``#`` and ``;`` start comment
  lines; blank lines are ignored; whitespace around keys and values is stripped.
- a key given twice in one section, a line outside any section, a malformed header or a line
  without ``=`` is an error naming the file and line.
- :func:`eval_int` evaluates integer arithmetic (``+ - * /``, parentheses, unary minus) with
  :mod:`ast` — never :func:`eval` — and rejects everything else.

Thread-safe: pure functions; the returned objects are immutable.
"""

from __future__ import annotations

import ast
import difflib
from dataclasses import dataclass

from pymetaq.server.errors import ConfigError


@dataclass(frozen=True)
class IniEntry:
    """One ``key=value`` line."""

    key: str
    value: str
    line: int


@dataclass(frozen=True)
class IniSection:
    """One ``[name]`` section with its entries in file order."""

    name: str
    line: int
    entries: tuple[IniEntry, ...]


def parse_ini(text: str, path: str) -> tuple[IniSection, ...]:
    """Split ``text`` into sections; raises :class:`ConfigError` on a syntax error."""
    sections: list[IniSection] = []
    name: str | None = None
    start = 0
    entries: list[IniEntry] = []
    seen: set[str] = set()
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            if not line.endswith("]") or len(line) < 3:
                raise ConfigError(f"{path}:{lineno}: malformed section header {line!r}")
            if name is not None:
                sections.append(IniSection(name, start, tuple(entries)))
            name, start, entries, seen = line[1:-1].strip(), lineno, [], set()
            if any(s.name == name for s in sections):
                raise ConfigError(f"{path}:{lineno}: section [{name}] appears twice")
            continue
        sep = _separator(line)
        if sep < 0:
            raise ConfigError(f"{path}:{lineno}: expected 'key=value', got {line!r}")
        if name is None:
            raise ConfigError(f"{path}:{lineno}: {line!r} is outside any [section]")
        key, value = line[:sep].strip(), line[sep + 1 :].strip()
        if not key:
            raise ConfigError(f"{path}:{lineno}: empty key in section [{name}]")
        if key in seen:
            raise ConfigError(f"{path}:{lineno}: key '{key}' given twice in section [{name}]")
        seen.add(key)
        entries.append(IniEntry(key, value, lineno))
    if name is not None:
        sections.append(IniSection(name, start, tuple(entries)))
    return tuple(sections)


def _separator(line: str) -> int:
    positions = [p for p in (line.find("="), line.find(":")) if p >= 0]
    return min(positions) if positions else -1


_BINOPS: dict[type[ast.operator], str] = {
    ast.Add: "+",
    ast.Sub: "-",
    ast.Mult: "*",
    ast.Div: "/",
}


def eval_int(expr: str) -> int:
    """Evaluate integer arithmetic such as ``1024*1024`` or ``10*60*1000``; ValueError if not."""
    try:
        tree = ast.parse(expr.strip(), mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"{expr!r} is not a number or simple arithmetic") from exc
    value = _eval_node(tree.body, expr)
    if isinstance(value, float):
        if not value.is_integer():
            raise ValueError(f"{expr!r} is not an integer ({value})")
        value = int(value)
    return value


def _eval_node(node: ast.expr, expr: str) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        value: int | float = node.value  # type: ignore[assignment]
        return value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        operand = _eval_node(node.operand, expr)
        return -operand if isinstance(node.op, ast.USub) else operand
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        left, right = _eval_node(node.left, expr), _eval_node(node.right, expr)
        if isinstance(node.op, ast.Add):
            return left + right
        if isinstance(node.op, ast.Sub):
            return left - right
        if isinstance(node.op, ast.Mult):
            if abs(left) > 1 << 62 or abs(right) > 1 << 62:
                raise ValueError(f"{expr!r} is too large")
            return left * right
        if right == 0:
            raise ValueError(f"{expr!r} divides by zero")
        return left / right
    raise ValueError(f"{expr!r} is not a number or simple arithmetic (+ - * / only)")


def parse_bool(value: str) -> bool:
    """MetaQ booleans: ``true`` / ``false`` (any case)."""
    lowered = value.strip().lower()
    if lowered == "true":
        return True
    if lowered == "false":
        return False
    raise ValueError(f"{value!r} is not a boolean (true or false)")


def did_you_mean(key: str, valid: list[str]) -> str:
    """A ``"; did you mean 'x'?"`` suffix for the closest valid key, or an empty string."""
    folded = {v.lower(): v for v in valid}
    if key.lower() in folded:
        return f"; did you mean '{folded[key.lower()]}'?"
    close = difflib.get_close_matches(key, valid, n=1, cutoff=0.6)
    return f"; did you mean '{close[0]}'?" if close else ""

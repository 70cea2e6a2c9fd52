"""Run the code blocks of a Markdown page (tests/test_docs.py): parsing, running, comparing.

Every fenced block is one of:

| block | what is done with it |
|---|---|
| ```` ```console ```` with ``$ `` lines | each command runs in ``bash`` (a trailing ``\\`` continues it); the lines after it up to the next ``$`` are its expected output (stdout and stderr) |
| ```` ``` ```` (no language) with ``-> `` / ``<- `` lines | a wire exchange: ``->`` lines are sent to the broker over TCP, each ``<-`` line is the next reply |
| ```` ```python ```` | run with the test's Python; an ``<!-- output -->`` block right after it is its expected stdout |
| marked ``<!-- not-run: why -->`` | not run (a grammar, a diagram, a benchmark that takes minutes, ...) |
| marked ``<!-- main-command -->`` / ``<!-- test-command -->`` | the README's two commands (tests/test_readme.py) |

Anything else fails the test: a new block must run or say why not. A page that needs ZooKeeper
or PostgreSQL says so once with ``<!-- page-services: zookeeper postgresql -->`` (not right
before a block; tests/test_docs.py starts them).

Expected output is compared line by line after normalising both sides (CRLF, message ids,
millisecond timestamps, elapsed times and rates, log timestamps); ``…`` in a line matches any
text, a line that is only ``…`` any number of lines. In wire exchanges ``\\r\\n`` stands for
CRLF, ``\\0`` for a NUL byte, ``<N bytes>`` for N bytes of ``x`` and ``<record "text">`` for
a complete record holding ``text``; ``  # ...`` at the end of a line is a comment; an indented
line continues the ``<-`` line above it (a reply of several lines, each ending in ``\\r\\n``).
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from pymetaq.client.protocol import NEED_DATA, Parser, ResultReply, Role, ValueReply
from pymetaq.storage.record import encode_record

_FENCE = re.compile(r"^```([A-Za-z]*)\n(.*?)^```\n", re.S | re.M)
_MARK = re.compile(r"<!--\s*([a-z-]+)(?::\s*((?:(?!-->).)*?))?\s*-->\s*\Z", re.S)

MARKS = ("not-run", "main-command", "test-command", "output")

#: (pattern, replacement) applied to expected and actual text before comparing
_VOLATILE = [
    (re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ", re.M), ""),
    (re.compile(r"\b\d{18,20}\b"), "<id>"),
    (re.compile(r"\b1[7-9]\d{11}\b"), "<ms>"),
    (re.compile(r"in \d+\.\d\ds \([\d,]+ msg/s\)"), "in <t>s (<r> msg/s)"),
]


@dataclass
class Block:
    path: str
    line: int
    lang: str
    text: str
    mark: str | None = None  # one of MARKS
    why: str = ""
    output: Block | None = None  # an ``output`` block that follows a python block

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"


def blocks(path: Path, name: str) -> list[Block]:
    """The page's fenced blocks, each with the marker comment right before it."""
    text = path.read_text(encoding="utf-8")
    found: list[Block] = []
    for m in _FENCE.finditer(text):
        before = text[: m.start()].rstrip()
        mark = _MARK.search(before)
        line = text.count("\n", 0, m.start()) + 1
        b = Block(name, line, m.group(1), m.group(2))
        if mark is not None:
            if mark.group(1) not in MARKS:
                raise AssertionError(f"{b.where}: unknown marker <!-- {mark.group(1)} -->")
            b.mark, b.why = mark.group(1), mark.group(2) or ""
        if b.mark == "output":
            if not found or found[-1].lang != "python":
                raise AssertionError(f"{b.where}: an output block must follow a python block")
            found[-1].output = b
            continue
        found.append(b)
    return found


def kind(b: Block) -> str:
    """``console``, ``wire``, ``python``, a marker, or ``unmarked``."""
    if b.mark is not None:
        return b.mark
    if b.lang == "console" and b.text.startswith("$ "):
        return "console"
    if b.lang == "" and b.text.startswith("-> "):
        return "wire"
    if b.lang == "python":
        return "python"
    return "unmarked"


# ---------------------------------------------------------------------------- comparing


def normalise(text: str) -> str:
    text = text.replace("\r\n", "\n")
    for pattern, repl in _VOLATILE:
        text = pattern.sub(repl, text)
    return "\n".join(line.rstrip() for line in text.split("\n")).strip("\n")


def matches(expected: str, actual: str) -> bool:
    """``actual`` fits ``expected`` (both normalised; ``…`` wildcards, see the module doc)."""
    parts = []
    for line in normalise(expected).split("\n"):
        if line.strip() == "…":
            parts.append(r"(?:[^\n]*\n)*?")
        else:
            parts.append(".*".join(map(re.escape, line.split("…"))) + r"\n")
    return re.fullmatch("".join(parts), normalise(actual) + "\n", re.S) is not None


# ---------------------------------------------------------------------------- console


@dataclass
class Command:
    command: str
    expected: str


def console_commands(b: Block) -> list[Command]:
    out: list[Command] = []
    lines = b.text.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.startswith("$ "):
            raise AssertionError(f"{b.where}: expected a '$ ' line, got {line!r}")
        cmd = line[2:]
        while cmd.endswith("\\"):  # kept: bash reads backslash-newline as a continuation
            i += 1
            cmd = cmd + "\n" + lines[i]
        i += 1
        expected = []
        while i < len(lines) and not lines[i].startswith("$ "):
            expected.append(lines[i])
            i += 1
        out.append(Command(cmd, "\n".join(expected)))
    return out


def run_shell(
    command: str, cwd: Path, env: dict[str, str], last_rc: int = 0, timeout: float = 120
) -> tuple[str, int]:
    """(stdout and stderr, exit code) of one command; ``$?`` is the previous one's code."""
    proc = subprocess.run(
        ["bash", "-o", "pipefail", "-c", f"(exit {last_rc}); {command}"],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
    )
    return proc.stdout, proc.returncode


def run_walkthrough(
    page: Path, name: str, script: str, cwd: Path, fix: dict[str, str], timeout: float = 300
) -> None:
    """Run the page's one console block that runs ``examples/<script>`` (a walkthrough that
    prints each command it runs, ``+ `` first) in ``cwd`` with ``examples`` linked there, after
    applying ``fix`` (shown text -> the test's: addresses, ports) to the command and to the
    output the page shows; fail with both texts if they differ."""
    (block,) = [b for b in blocks(page, name) if script in b.text and kind(b) == "console"]
    (cmd,) = console_commands(block)

    def rewrite(text: str) -> str:
        for k, v in fix.items():
            text = text.replace(k, v)
        return text

    examples = cwd / "examples"
    if not examples.exists():
        examples.symlink_to(page.parent.parent / "examples", target_is_directory=True)
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
    got, rc = run_shell(rewrite(cmd.command), cwd, env, timeout=timeout)
    assert rc == 0, f"{block.where}: exited {rc}:\n{got}"
    want = rewrite(cmd.expected)
    assert matches(want, got), f"{block.where}: printed\n{got}\n--- the page shows:\n{want}"


# ---------------------------------------------------------------------------- wire


_RECORD = re.compile(r'<record "([^"]*)">')
_BYTES = re.compile(r"<(\d+) bytes>")


def wire_bytes(text: str) -> bytes:
    """A ``->`` line as bytes: ``\\r\\n``, ``\\0`` (a NUL byte), ``<N bytes>``,
    ``<record "text">``."""
    out = bytearray()
    pos = 0
    for m in re.finditer(r'\\r\\n|\\0|<\d+ bytes>|<record "[^"]*">', text):
        out += text[pos : m.start()].encode()
        token = m.group(0)
        if token == "\\r\\n":
            out += b"\r\n"
        elif token == "\\0":
            out += b"\0"
        elif (r := _RECORD.fullmatch(token)) is not None:
            out += encode_record(r.group(1).encode())
        elif (n := _BYTES.fullmatch(token)) is not None:
            out += b"x" * int(n.group(1))
        pos = m.end()
    out += text[pos:].encode()
    return bytes(out)


def render(reply: object) -> str:
    """A reply as a ``<-`` line shows it: the header line, ``\\r\\n``, the body (of a
    ``value`` reply as ``…``)."""
    if isinstance(reply, ResultReply):
        body = reply.body.decode("utf-8", "replace").replace("\r\n", "\\r\\n")
        return f"result {reply.code} {len(reply.body)} {reply.opaque}\\r\\n{body}"
    assert isinstance(reply, ValueReply)
    return f"value {len(reply.data)} {reply.opaque}\\r\\n…"


@dataclass
class Wire:
    address: tuple[str, int]
    sock: socket.socket | None = None
    parser: Parser = field(default_factory=lambda: Parser(Role.CLIENT))

    def send(self, data: bytes) -> None:
        if self.sock is None:
            self.sock = socket.create_connection(self.address, timeout=30)
            self.parser = Parser(Role.CLIENT)
        self.sock.sendall(data)

    def reply(self) -> str:
        assert self.sock is not None, "a <- line before any ->"
        while True:
            event = self.parser.next_event()
            if event is not NEED_DATA:
                return render(event)
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                self.close()
                return "(the broker closed the connection)"
            self.parser.feed(chunk)

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


def strip_comment(line: str) -> str:
    return re.sub(r"\s{2,}#.*$", "", line)


def wire_lines(b: Block) -> list[str]:
    """The block's lines, an indented line joined to the ``<-`` line above it (a reply of
    several lines is written one ``\\r\\n``-terminated line under another)."""
    out: list[str] = []
    for raw in b.text.rstrip("\n").split("\n"):
        if raw[:1] in (" ", "\t") and raw.strip() and out and out[-1].startswith("<- "):
            out[-1] = strip_comment(out[-1]) + strip_comment(raw.strip())
        else:
            out.append(raw)
    return out


def run_wire(b: Block, address: tuple[str, int], port_fix: dict[str, str]) -> list[str]:
    """Problems found running the exchange (empty: it ran as written)."""
    problems = []
    wire = Wire(address)
    try:
        for raw in wire_lines(b):
            line = strip_comment(raw)
            if line.startswith("-> "):
                wire.send(wire_bytes(line[3:]))
            elif line.startswith("<- "):
                want = line[3:]
                for k, v in port_fix.items():
                    want = want.replace(k, v)
                got = wire.reply()
                if not matches(want.replace("\\r\\n", "⏎"), got.replace("\\r\\n", "⏎")):
                    problems.append(f"{b.where}: {raw!r}\n  expected {want!r}\n  got      {got!r}")
            elif line.strip() == "(new connection)":
                wire.close()
            else:
                raise AssertionError(f"{b.where}: not a wire line: {raw!r}")
    finally:
        wire.close()
    return problems

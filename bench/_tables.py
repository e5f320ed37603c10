"""Where a benchmark's tables go: ``docs/benchmarks/<name>.md``, replaced by every run.

A figure quoted in prose goes stale at the next rerun; a table the bench writes itself does not.
Each file is stamped with the commit it was measured at (``git rev-parse --short HEAD``, marked
when the working tree had uncommitted changes), the date (UTC) and the command that produced it,
so a reader can rerun it and compare.

A bench that prints its tables as it goes ends with ``record_run(name, main)``: its stdout is
shown as usual and, once ``main`` returns 0, written as the file. ``name`` may be a function of
the command-line arguments where one script measures several configurations (a 6-day and a
31-day run), so one run never replaces another configuration's tables.
"""

from __future__ import annotations

import datetime as dt
import io
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "benchmarks"
_NAME = re.compile(r"[a-z0-9][a-z0-9_.-]*")


def commit() -> str:
    """The short commit of the checkout, ``+ uncommitted changes`` when the tree is dirty."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()

    try:
        head = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    return f"{head} + uncommitted changes" if dirty else head


def command_line(argv: list[str] | None = None, script: str | None = None) -> str:
    """The command that reproduces this run, as a user types it from the repository root."""
    argv = sys.argv[1:] if argv is None else argv
    path = Path(script or sys.argv[0]).resolve()
    try:
        shown = str(path.relative_to(ROOT))
    except ValueError:
        shown = str(path)
    return "PYTHONPATH=include python " + " ".join(shlex.quote(a) for a in [shown, *argv])


def write_table(name: str, markdown: str, command: str, *, directory: Path | None = None) -> Path:
    """Write ``docs/benchmarks/<name>.md``: a header (commit, date, command) and ``markdown``.

    The file is replaced as a whole (written beside and moved into place, so a failed write
    leaves the previous tables). Returns the path written.
    """
    if not _NAME.fullmatch(name):
        raise ValueError(f"write_table: name {name!r}: use lower-case letters, digits, '.', '_' and '-'")
    if not markdown.strip():
        raise ValueError(f"write_table: {name}: no tables to write (the bench printed nothing)")
    out = Path(directory or DOCS)
    out.mkdir(parents=True, exist_ok=True)
    today = dt.datetime.now(dt.timezone.utc).date().isoformat()
    text = (
        f"# {name}\n\n"
        f"Written by the bench itself (`bench/_tables.py`); a rerun replaces this file.\n\n"
        f"Measured at commit `{commit()}` on {today} with:\n\n"
        f"```bash\n{command}\n```\n\n"
        f"{markdown.rstrip()}\n"
    )
    path = out / f"{name}.md"
    tmp = path.with_suffix(f".md.tmp{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    return path


def option(argv: list[str], flag: str, default: str | None = None) -> str | None:
    """The value given to ``flag`` in ``argv`` (``--days 6`` or ``--days=6``; the last one wins),
    else ``default``: what a bench's file name reads of the arguments that change its figures."""
    value = default
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
    return value


class _Tee(io.TextIOBase):
    """A stdout that prints as usual and keeps a copy of what was printed."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.copy = io.StringIO()

    def write(self, s: str) -> int:
        self.copy.write(s)
        return self.inner.write(s)

    def flush(self) -> None:
        self.inner.flush()

    def isatty(self) -> bool:
        return self.inner.isatty()


def record_run(name: str | Callable[[list[str]], str], main: Callable[[], int | None]) -> int:
    """Run a bench's ``main()`` with its stdout kept; on success write that output as its tables.

    ``name`` is the file's name, or a function of the command-line arguments that gives it.
    Returns ``main``'s exit status (``None`` counts as 0); nothing is written when it fails.
    """
    argv = sys.argv[1:]
    label = name(argv) if callable(name) else name
    tee = _Tee(sys.stdout)
    sys.stdout = tee
    try:
        rc = main() or 0
    finally:
        sys.stdout = tee.inner
    if rc == 0:
        path = write_table(label, _fenced_prose(tee.copy.getvalue()), command_line(argv))
        print(f"(tables written to {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path})")
    return rc


def _fenced_prose(text: str) -> str:
    """A bench's printed output as markdown: tables and lists as they are, other lines kept line
    for line, column-aligned text in a code block, a blank line before each table or block."""
    out: list[str] = []
    block: list[str] = []

    def gap() -> None:
        if out and out[-1]:
            out.append("")

    for line in text.rstrip().splitlines():
        table = line.lstrip().startswith("|")
        if "  " in line.strip() and not table and not line.lstrip().startswith(("-", "*")):
            block.append(line)
            continue
        if block:
            gap()
            out += ["```", *block, "```", ""]
            block = []
        if not line and (not out or not out[-1]):
            continue
        if table and not (out and out[-1].lstrip().startswith("|")):
            gap()
        elif not table and out and out[-1].lstrip().startswith("|") and line:
            out.append("")
        out.append(line if table or not line else line + "  ")
    if block:
        gap()
        out += ["```", *block, "```"]
    return "\n".join(out)

"""Opening a file a user names as input: a regular file of bounded size holding UTF-8 text, and
YAML read with bounded nesting and aliases.

Everything the package reads from a path a user gave (platforms.yaml, a scenario, a CSV series,
a trace or history file) goes through :func:`read_text` (or :func:`load_yaml`), so that what is
not such a file is refused in one line before it is read: a directory, a FIFO (which would
block forever), a socket, a device (``/dev/zero`` never ends), a file over its kind's limit
(``MAX_*_BYTES``; for a compressed file, its content once decompressed), or bytes that are not
UTF-8 (a UTF-8 byte-order mark is accepted and dropped).

A leaf module: it imports nothing from gpupool but :mod:`gpupool.errors`, so that every layer
may open its inputs through it.
"""

from __future__ import annotations

import codecs
import io
import os
import stat
from pathlib import Path
from typing import Any, Callable

import yaml
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.events import AliasEvent
from yaml.resolver import Resolver

from gpupool.errors import UserError, one_line, shown

MiB = 1 << 20
#: the most bytes a platforms.yaml may hold: the listed pool nodes of a fleet of tens of thousands
#: of nodes fit, and it still loads in seconds
MAX_CONFIG_BYTES = 2 * MiB
#: the most bytes a scenario file may hold (its traces are files of their own)
MAX_SCENARIO_BYTES = 1 * MiB
#: the most bytes a CSV series may hold (``gpupool detect``/``forecast`` input, a what-if's
#: ``csv`` history), decompressed: a year of one-minute samples with many other columns beside
MAX_SERIES_BYTES = 256 * MiB
#: the most bytes a trace or history file may hold (a Helios CSV, a sacct log, a pod list, a
#: Prometheus answer), decompressed: years of one-minute Helios rows, a million sacct jobs
MAX_TRACE_BYTES = 256 * MiB

#: the deepest a YAML input may nest (collections within collections); the files gpupool reads
#: nest a handful of levels
MAX_YAML_DEPTH = 64
#: the most nodes a YAML input's aliases (``*name``, ``<<: *name``) may add, counting an alias
#: of a collection as every node it holds: a few hundred bytes of nested aliases ("a billion
#: laughs") would otherwise stand for billions of values
MAX_YAML_ALIAS_NODES = 10_000

#: what each file suffix is compressed with, as pandas infers it from a path (longest first)
_COMPRESSION = ((".tar.gz", "tar"), (".tar.bz2", "tar"), (".tar.xz", "tar"), (".tar", "tar"), (".gz", "gzip"),
                (".bz2", "bz2"), (".xz", "xz"), (".zip", "zip"), (".zst", "zstd"))


class InputFileError(UserError, ValueError):
    """An input file that cannot be read: not a regular file, too large, or not UTF-8 text."""


class _Refused(Exception):
    """What is wrong with an archive's shape or a YAML document over a limit (with its line)."""


ErrorType = Callable[[str], Exception]


def file_problem(path: str | Path, max_bytes: int | None = None, what: str = "input") -> str | None:
    """Why ``path`` cannot be read as an input (``"no such file"``, ``"is a directory"``, ``"is a
    FIFO, not a regular file"``, ``"is 300,000,000 bytes, more than ..."``), or None when it is
    a regular file of at most ``max_bytes``. Nothing is opened: a FIFO or a device is judged by
    its type alone."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return "no such file"
    except OSError as exc:
        return f"cannot be looked up ({exc.strerror or exc})"
    return _problem(st, max_bytes, what)


def read_text(path: str | Path, what: str, max_bytes: int, error: ErrorType = InputFileError,
              decompress: bool = False) -> str:
    """The text of the file at ``path``, a ``what`` (``"scenario"``, ``"CSV"``...; the messages
    name it), refused with ``error("PATH: cannot read WHAT: REASON")`` when it is not a regular
    file, holds more than ``max_bytes`` bytes or is not UTF-8 text. A leading UTF-8 byte-order
    mark is dropped. ``decompress``: a path ending in ``.gz``, ``.bz2``, ``.xz``, ``.zip``,
    ``.tar[.*]`` (one file inside) is decompressed (``.zst`` is refused), as pandas does with such a path,
    and ``max_bytes`` bounds the decompressed content."""
    path = Path(path)

    def refuse(reason: str) -> Exception:
        return error(f"{path}: cannot read {what}: {reason}")

    problem = file_problem(path, max_bytes, what)
    if problem is not None:
        raise refuse(problem)
    try:
        # never blocks: a FIFO put in the file's place since it was looked at opens at once
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise refuse(exc.strerror or str(exc)) from None
    with os.fdopen(fd, "rb") as fh:
        problem = _problem(os.fstat(fh.fileno()), max_bytes, what)
        if problem is not None:
            raise refuse(problem)
        try:
            data = fh.read(max_bytes + 1)
        except OSError as exc:
            raise refuse(exc.strerror or str(exc)) from None
    if len(data) > max_bytes:  # it grew since it was looked at
        raise refuse(f"holds more than {max_bytes:,} bytes, the most a {what} may hold")
    method = _compression(path) if decompress else None
    if method is not None:
        data = _decompressed(data, method, max_bytes, what, refuse)
    return _decoded(data, method, refuse)


def load_yaml(path: str | Path, what: str, max_bytes: int, error: ErrorType = InputFileError) -> Any:
    """The YAML document in the file at ``path`` (:func:`read_text`, then :func:`parse_yaml`)."""
    return parse_yaml(read_text(path, what, max_bytes, error), str(path), error)


def parse_yaml(text: str, where: str, error: ErrorType = InputFileError) -> Any:
    """``text`` as YAML's safe types, read with libyaml where it is installed; ``error("WHERE:
    ...")`` in one line when it is not YAML, nests deeper than :data:`MAX_YAML_DEPTH` or its
    aliases stand for more than :data:`MAX_YAML_ALIAS_NODES` nodes."""
    loader = _BoundedLoader(text)
    try:
        return loader.get_single_data()
    except _Refused as exc:
        raise error(f"{where}: {exc}") from None
    except yaml.YAMLError as exc:
        raise error(f"{where}: not valid YAML ({_yaml_reason(exc)})") from None
    except (ValueError, OverflowError) as exc:  # a scalar YAML cannot build: a 13th month, a 5,000-digit integer
        raise error(f"{where}: not valid YAML ({one_line(str(exc), 200)})") from None
    finally:
        loader.dispose()


# ------------------------------------------------------------------------------ internals
def _problem(st: os.stat_result, max_bytes: int | None, what: str) -> str | None:
    mode = st.st_mode
    if stat.S_ISREG(mode):
        if max_bytes is not None and st.st_size > max_bytes:
            return f"is {st.st_size:,} bytes, more than the {max_bytes:,} a {what} may hold"
        return None
    for test, name in ((stat.S_ISDIR, None), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return "is a directory" if name is None else f"is {name}, not a regular file"
    return "is not a regular file"


def _compression(path: Path) -> str | None:
    name = path.name.lower()
    return next((method for suffix, method in _COMPRESSION if name.endswith(suffix)), None)


def _decompressed(data: bytes, method: str, max_bytes: int, what: str, refuse) -> bytes:
    """``data`` decompressed, reading at most ``max_bytes + 1`` bytes of its content."""
    import bz2
    import gzip
    import lzma
    import tarfile
    import zipfile
    import zlib

    raw = io.BytesIO(data)
    try:
        if method == "gzip":
            out = gzip.GzipFile(fileobj=raw).read(max_bytes + 1)
        elif method == "bz2":
            out = bz2.BZ2File(raw).read(max_bytes + 1)
        elif method == "xz":
            out = lzma.LZMAFile(raw).read(max_bytes + 1)
        elif method == "zip":
            with zipfile.ZipFile(raw) as archive:
                names = [i for i in archive.infolist() if not i.is_dir()]
                if len(names) != 1:
                    raise _Refused(f"a zip archive holding {len(names)} files; give one holding one")
                with archive.open(names[0]) as member:
                    out = member.read(max_bytes + 1)
        elif method == "tar":
            with tarfile.open(fileobj=raw, mode="r:*") as archive:
                members = [m for m in archive.getmembers() if m.isfile()]
                if len(members) != 1:
                    raise _Refused(f"a tar archive holding {len(members)} files; give one holding one")
                out = archive.extractfile(members[0]).read(max_bytes + 1)
        else:  # zstd: the standard library has no decoder, and none is a dependency
            raise _Refused("compressed with zstd, which gpupool does not read; decompress it first")
    except _Refused as exc:
        raise refuse(str(exc)) from None
    except (OSError, EOFError, zlib.error, lzma.LZMAError, zipfile.BadZipFile, tarfile.TarError, ValueError) as exc:
        raise refuse(f"not a valid {method} file ({one_line(str(exc), 200)})") from None
    if len(out) > max_bytes:
        raise refuse(f"holds more than {max_bytes:,} bytes once decompressed, the most a {what} may hold")
    return out


def _decoded(data: bytes, method: str | None, refuse) -> str:
    skip = len(codecs.BOM_UTF8) if data.startswith(codecs.BOM_UTF8) else 0
    try:
        return data[skip:].decode("utf-8")
    except UnicodeDecodeError as exc:
        at = exc.start + skip
        line = data.count(b"\n", 0, at) + 1
        inside = f" of its {method}-decompressed content" if method else ""
        raise refuse(f"not UTF-8 text (undecodable byte 0x{data[at]:02x} at offset {at:,}{inside}, "
                     f"line {line:,})") from None


def _yaml_reason(exc: yaml.YAMLError) -> str:
    """A YAML error as one short line: what is wrong and at which line and column."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem:
        mark = exc.problem_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        context = f" ({exc.context})" if exc.context else ""
        return one_line(f"{exc.problem}{where}{context}", 200)
    return one_line(str(exc), 200)


try:
    from yaml.cyaml import CParser as _Parser
except ImportError:  # pragma: no cover - PyYAML built without libyaml
    _Parser = None


class _BoundedComposer(Composer):
    """YAML's composer counting depth and the nodes aliases stand for (libyaml parses where it
    is installed: the pure-Python parser takes many times as long)."""

    def _bound_init(self) -> None:
        self._depth = 0
        self._aliased = 0  # nodes the aliases so far stand for
        self._nodes = 0  # nodes composed so far, each alias counted as the nodes it stands for
        self._sizes: dict[str, int] = {}  # anchor -> the nodes its collection holds, itself included

    def compose_node(self, parent, index):  # noqa: D102 - yaml's hook
        event = self.peek_event()
        line = event.start_mark.line + 1 if event.start_mark is not None else "?"
        if isinstance(event, AliasEvent):
            size = self._sizes.get(event.anchor, 1)
            self._aliased += size
            self._nodes += size
            if self._aliased > MAX_YAML_ALIAS_NODES:
                raise _Refused(f"line {line}: aliases stand for more than {MAX_YAML_ALIAS_NODES:,} values "
                               f"(alias {shown(event.anchor)}); write the values out")
            return super().compose_node(parent, index)
        self._depth += 1
        if self._depth > MAX_YAML_DEPTH:
            raise _Refused(f"line {line}: nested deeper than {MAX_YAML_DEPTH} levels")
        before = self._nodes
        self._nodes += 1
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        anchor = getattr(event, "anchor", None)
        if anchor is not None:
            self._sizes[anchor] = self._nodes - before
        return node


if _Parser is not None:
    class _BoundedLoader(_Parser, _BoundedComposer, SafeConstructor, Resolver):
        """libyaml's parser, the counting composer, YAML's safe constructor."""

        def __init__(self, stream):
            _Parser.__init__(self, stream)
            _BoundedComposer.__init__(self)
            SafeConstructor.__init__(self)
            Resolver.__init__(self)
            self._bound_init()

        # the composer's, not the C parser's own (which counts nothing)
        check_node = Composer.check_node
        get_node = Composer.get_node
        get_single_node = Composer.get_single_node
else:  # pragma: no cover - PyYAML built without libyaml
    class _BoundedLoader(_BoundedComposer, yaml.SafeLoader):
        """YAML's safe loader with the counting composer."""

        def __init__(self, stream):
            yaml.SafeLoader.__init__(self, stream)
            self._bound_init()

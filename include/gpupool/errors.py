"""Which exceptions are a user's to fix (bad input, config, unreachable service) and so get
one clear line from the CLI instead of a traceback.

This module is a leaf: it imports nothing from gpupool. Each layer's own error classes
subclass :class:`UserError` where the fix is the user's, so the CLI asks one ``isinstance``
question and no layer gains an import path into another through here.
"""

from __future__ import annotations


class UserError(Exception):
    """Base of every error whose fix is the user's: bad input, a wrong setting, a service
    that cannot be reached with the credentials given. The CLI prints its message as one
    line and exits 2."""


class UsageError(UserError, ValueError):
    """A command-line option or argument out of its range, or an input/output clash; the message
    names the option."""


def is_user_error(exc: BaseException) -> bool:
    """True when ``exc`` is the user's to fix (a :class:`UserError`, or a missing input file)."""
    return isinstance(exc, (UserError, FileNotFoundError))


def shown(value: object, limit: int = 60) -> str:
    """``value``'s repr for an error message: one line of at most ``limit`` characters, control
    characters escaped. A large collection is never rendered whole (only its first items are),
    so showing one costs the same whatever its size."""
    import reprlib

    short = reprlib.Repr()
    short.maxlevel, short.maxstring, short.maxother = 3, limit, limit
    short.maxlist = short.maxtuple = short.maxdict = short.maxset = short.maxfrozenset = short.maxdeque = 6
    try:
        text = short.repr(value)
    except ValueError:  # an integer of more digits than Python renders
        text = f"<{type(value).__name__}>"
    if not text.isprintable():
        text = text.encode("unicode_escape").decode("ascii")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def one_line(message: str, limit: int = 300) -> str:
    """``message`` on one line of at most ``limit`` characters: a validator's message (pydantic's,
    a library's) that quotes a whole bad value is cut, never echoed whole."""
    text = " ".join(message.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"

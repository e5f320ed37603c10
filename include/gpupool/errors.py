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

"""Gnocchi's REST API as a WSGI application for gunicorn.

`gnocchi.rest.wsgi` parses `sys.argv` as Gnocchi's own command line, so gunicorn's arguments
are replaced by `--config-file $GNOCCHI_CONFIG_FILE` while it loads.
"""

import os
import sys

_argv, sys.argv = sys.argv, [sys.argv[0], "--config-file", os.environ["GNOCCHI_CONFIG_FILE"]]
try:
    from gnocchi.rest.wsgi import application  # noqa: F401
finally:
    sys.argv = _argv

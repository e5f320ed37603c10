"""Keystone's public WSGI application for gunicorn (Keystone ships no gunicorn entry point).

Keystone parses `sys.argv` as its own command line while it configures itself, so
gunicorn's arguments are hidden from it. Its config file comes from
OS_KEYSTONE_CONFIG_DIR / OS_KEYSTONE_CONFIG_FILES.
"""

import sys

_argv, sys.argv = sys.argv, sys.argv[:1]
try:
    from keystone.server.wsgi import initialize_public_application

    application = initialize_public_application()
finally:
    sys.argv = _argv

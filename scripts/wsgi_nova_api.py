"""nova-api (the compute API) for gunicorn; config from OS_NOVA_CONFIG_DIR (nova.conf there).

Nova's WSGI entry point parses the process' command line with oslo.config, which would read
gunicorn's own options as its own: it sees only the program name.
"""

import sys

sys.argv = sys.argv[:1]

from nova.wsgi.osapi_compute import application  # noqa: E402,F401

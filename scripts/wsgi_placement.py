"""Placement's WSGI application for gunicorn; config from OS_PLACEMENT_CONFIG_DIR."""

from placement.wsgi.api import application  # noqa: F401

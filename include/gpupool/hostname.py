"""The host name a worker reports for the task instances it runs.

Airflow records it on every task instance (`[core] hostname_callable`). Where several workers
share one machine (scripts/celery-stack.sh starts two on loopback) each is told its own name in
`GPUPOOL_WORKER_HOSTNAME`; elsewhere (one worker per host or container) it is the host's FQDN.
"""

from __future__ import annotations

import os
import socket

ENV = "GPUPOOL_WORKER_HOSTNAME"


def worker_hostname() -> str:
    return os.environ.get(ENV) or socket.getfqdn()

"""The host name task instances record: a worker's own where several share one machine."""

import socket

from gpupool.hostname import ENV, worker_hostname


def test_worker_given_a_name_reports_it(monkeypatch):
    monkeypatch.setenv(ENV, "w2@node-a")
    assert worker_hostname() == "w2@node-a"


def test_without_a_name_the_host_fqdn(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    assert worker_hostname() == socket.getfqdn()
    monkeypatch.setenv(ENV, "")
    assert worker_hostname() == socket.getfqdn()

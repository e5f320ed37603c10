"""Actuation: the handover state machine, in-place MIG re-layouts and one actuator per platform.

``handover`` (the two-phase, audited, compare-and-set handover of a node between platforms),
``relayout`` (a plan's MIG re-layouts of nodes that stay put), ``actuators`` (the interface and
the Slurm, Kubernetes and OpenStack actuators) and ``marks`` (the marks gpupool leaves on a
platform, a leaf the platform-API emulator reads too). Actuation never knows whether a platform
is simulated, and never imports the jobs that drive it (:mod:`gpupool.jobs`).
"""

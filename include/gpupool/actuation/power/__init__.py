"""Parking: power as a node state (``machine``) and the means that park and wake a node through
the platforms' own interfaces (``slurm``, ``redfish``, ``ironic``; ``holds`` for the platform's
own hold around a BMC; ``factory`` from a platform's ``power:`` configuration). Modules import
their client libraries lazily, so importing this package is cheap."""

"""Which exceptions are a user's to fix (bad input, config, unreachable service) and so get
one clear line from the CLI instead of a traceback."""

from __future__ import annotations


class UsageError(ValueError):
    """A command-line option or argument out of its range, or an input/output clash; the message
    names the option."""


def is_user_error(exc: BaseException) -> bool:
    from gpupool.canonical import CanonicalFrameError
    from gpupool.config import ConfigError
    from gpupool.staging.db import StagingError
    from gpupool.staging.loader import LoadError
    from gpupool.tsio import SeriesInputError

    known: tuple[type[BaseException], ...] = (
        UsageError, ConfigError, StagingError, LoadError, CanonicalFrameError, SeriesInputError, FileNotFoundError
    )
    try:
        from gpupool.pipeline import WindowError

        known += (WindowError,)
    except ImportError:  # pragma: no cover
        pass
    try:
        from gpupool.sources.base import SourceError

        known += (SourceError,)
    except ImportError:
        pass
    try:
        from gpupool.sim.scenario import ScenarioError
        from gpupool.sim.traces import TraceError
        from gpupool.sim.world import WorldError

        known += (ScenarioError, TraceError, WorldError)
    except ImportError:
        pass
    try:
        from gpupool.allocate.actuators.base import ActuationConfigError
        from gpupool.allocate.handover import HandoverError
        from gpupool.sources.factory import ConnectionError_

        known += (ConnectionError_, ActuationConfigError, HandoverError)
    except ImportError:
        pass
    try:
        from gpupool.allocate.planner import PlanningError

        known += (PlanningError,)
    except ImportError:
        pass
    return isinstance(exc, known)

"""gpupool: pool the GPU nodes of several platforms and move them ahead of demand."""

__version__ = "0.1.0"

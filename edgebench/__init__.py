"""edgebench: device benchmarking and profiling lab harness for on-device AI."""

__version__ = "0.1.0"

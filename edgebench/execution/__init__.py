"""Execution: jobs and suites, running a job on a device, the device session (lease, retries, cool-down),
the fleet runner, Dask clusters, and run provenance."""

"""Execution: jobs and suites, running a job on a device, the device session (lease, retries, cool-down),
the fleet runner, one-shot runs, Dask clusters, the spool that keeps finished jobs the store refused, and
run provenance."""

"""Orchestration: the layer above the roles that composes them (run, reference, sweep, compare, bench)."""

import splitleak.grpc_log  # noqa: F401 - before grpc is imported

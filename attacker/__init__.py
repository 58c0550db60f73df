"""The attacker: the sidecar that records what a party receives, and the offline analysis."""

import splitleak.grpc_log  # noqa: F401 - before grpc is imported

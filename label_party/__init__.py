"""The label party: holds the labels and the top model, serves the session."""

import splitleak.grpc_log  # noqa: F401 - before grpc is imported

"""A passive party: holds its feature columns and its bottom model, joins the label party."""

import splitleak.grpc_log  # noqa: F401 - before grpc is imported

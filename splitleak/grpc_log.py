"""gRPC's own log lines in a role's process: ERROR and up only, set before grpc is imported.

gRPC's C core prints its INFO lines to stderr (a refused TLS handshake: "I1128 ...
ssl_transport_security.cc:2563] Handshake failed ..."), ahead of the party's own sentence
naming the cause. From ERROR up it still prints, so a crash's last words (a FATAL line before
the abort) are kept. gRPC reads GRPC_VERBOSITY once, when grpc is first imported: every role's
package (label_party, passive_party, attacker, orchestration) imports this module first. A value
the user sets (GRPC_VERBOSITY=debug) wins; a program that only imports splitleak to read runs
is left as it is.
"""

import os

os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

"""The sidecar process: the Record service, its server, and the append-only gradient log it writes."""

"""VFLAIR's integrity attacks (backdoor, noisy samples, missing features): scoring, plug-ins and
their report section."""

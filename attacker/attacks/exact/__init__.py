"""EXACT (Qiu et al.): the white-box plug-in and its report section."""

"""`splitleak compare`: the trade-off report of a sweep (tables with CIs, DCS, Pareto plots)."""

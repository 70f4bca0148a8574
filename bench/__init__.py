"""fairlane's benchmarks and device drivers: each module one benchmark, JSON out, a table printed last.

They drive the engine (`replica/`), the cluster (`cluster/`) or the load generator (`loadtest/`);
nothing in those packages imports this one.
"""

"""Operations: a local cluster for the CLI and benchmarks, fault drills and the soak."""

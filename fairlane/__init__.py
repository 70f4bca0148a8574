"""The `fairlane` command line: serve, demo, load tests, reports, drills and benchmarks."""

"""Tools that build what the repository keeps (the benchmark sets in benchmarks/, the page's
screenshot in docs/): one module each, run from the repository root as `python3 -m tools.NAME`.
What each builds: tools/README.md."""

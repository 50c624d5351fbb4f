"""attn's benchmarks: one module each, run from the repository root as `python3 -m bench.NAME`, all
built on one small toolkit (`bench/toolkit.py`). Every benchmark answers --help and has a --smoke
mode that runs it end to end on a tiny model in seconds (tests/test_bench.py runs both), so that a
refactor cannot break one unseen. Figures and the commands that produce them: docs/benchmarks.md."""

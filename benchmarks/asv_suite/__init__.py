"""The asv suite, and nothing else: asv.conf.json's benchmark_dir points here.

asv imports every module in this folder inside its own environment (the pinned stack of
asv.conf.json's matrix, gembench installed --no-deps: no pytest, no matplotlib) and takes every
name starting with time_, track_, mem_ or peakmem_ for a benchmark. So a module here imports
only the standard library and gembench's run path, and a helper never carries one of those
prefixes. pytest-benchmark micro-benchmarks and printed scripts live one folder up, in
benchmarks/. tests/test_asv.py runs asv's own check and a quick run of this folder the way asv
sees it, and fails on either mistake.
"""

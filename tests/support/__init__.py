"""Shared test code, no tests: pipelines of a test's own, reading the Delta tables back, the drain
processes a test starts, and the per-source harnesses of the contract suite
(tests/integration/test_contract.py). Test modules import from here, never from each other."""

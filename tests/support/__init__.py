"""Shared test code, no tests: pipelines of a test's own, reading the Delta tables back, the drain
processes a test starts, the embedded services' command line (`services`), the per-source harnesses of
the contract suite (tests/integration/test_contract.py) and the toy kind that proves the run's order
(tests/unit/test_drain_order.py). Test modules import from here, never from each other."""

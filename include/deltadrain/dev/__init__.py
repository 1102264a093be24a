"""Development tools, outside the runtime: the embedded services (`deltadrain services`), sample
events (`produce`), the demo, the benchmark harness and the class-data archive's training drain.

The drain path, the orchestration and the view import none of this; only the command line's tool
commands do, when they are run.
"""

__all__ = ["archive_training", "bench", "demo", "produce", "s3http", "services"]

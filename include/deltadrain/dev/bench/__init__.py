"""`deltadrain bench`: the Valkey drain measured against the raw limits, side by side, in one run;
`--source kafka`: the Kafka drain against Structured Streaming (run_kafka_bench).

Phases (each in a process of its own where peak memory matters, so peaks do not mix):
1. produce N ~200-byte JSON messages over P stream partitions;
2. raw read limit: XREADGROUP-only over the same entries with a separate group, same Spark task plan;
3. the drain: batches of `--batch` until the backlog is gone (JVM start excluded);
4. raw write limit: plain Delta append of the same rows (read back from the drained table);
5. fixed overhead: a one-message batch;
6. driver memory as the backlog grows 10x: peak RSS of the driver (Python) and of its JVM, and the
   JVM's live heap after the last batch (used heap after a full GC: what it retains, not what G1 grew to);
7. batch time into a target holding 1x and 100x rows (the MERGE's window keeps the scan bounded).

The drain phases also report where the CPU went (`cpu_by_role`): on a small machine the drain's rate
is set by the cores it shares with the source's server, not by any one step's latency.
"""

from deltadrain.dev.bench.measure import (
           cpu_by_role,
           cpu_report,
           jvm_live_heap_mib,
           memory_report,
           reset_peak_rss,
)
from deltadrain.dev.bench.phases import single_process_batch, target_shaped_rows
from deltadrain.dev.bench.runs import (
           combine_rounds,
           executor_ratios,
           run_bench,
           run_kafka_bench,
           run_lake_bench,
)
from deltadrain.dev.bench.setup import bench_source

__all__ = ["bench_source", "combine_rounds", "cpu_by_role", "cpu_report", "executor_ratios", "jvm_live_heap_mib", "own_cpu_seconds",
           "memory_report", "reset_peak_rss", "run_bench", "run_kafka_bench", "run_lake_bench",
           "single_process_batch", "target_shaped_rows"]

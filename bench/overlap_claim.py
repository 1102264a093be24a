"""Would claiming batch n+1 while batch n commits pay? (docs/benchmarks.md, "eleventh round")

An experiment, not the drain's code path. In one Spark session it drains the same entries
(`bench/ab_setup_valkey.py` makes the configs, each with a consumer group and a lake of its own)
either batch after batch, as a catch-up task does ("before" configs), or with the claim of the next
batch started in a second thread as soon as a batch's own claim is done ("after" configs). That
claim reads only new entries (XREADGROUP, no XAUTOCLAIM), so it cannot take over the running
batch's entries. Every run's table is read back: rows, distinct ids, and nothing left pending.

    DELTADRAIN_HOME=/tmp/ddov DELTADRAIN_VALKEY_PORT=26982 .venv/bin/python bench/ab_setup_valkey.py WORKDIR 1600000
    DELTADRAIN_HOME=/tmp/ddov DELTADRAIN_VALKEY_PORT=26982 \\
        .venv/bin/python bench/overlap_claim.py WORKDIR 8 before1,after1,after2,before2 > out.json
"""

import json
import sys
import threading
import time

from deltadrain.claim import allocate, claim_arrow, plan
from deltadrain.config import load_config
from deltadrain.connections import group_counts, valkey_client
from deltadrain.drain import ValkeyDrain, claim_schema, drain, new_run_id
from deltadrain.spark import get_spark
from deltadrain.stage import stage


class Prefetching(ValkeyDrain):
    """A run whose claim may have been done before it started (`ahead`), and which calls
    `on_claimed` when its own claim is done, before its commit."""

    ahead = None
    on_claimed = None

    def claim(self, quotas):
        return self.ahead if self.ahead is not None else super().claim(quotas)

    def claim_new_entries(self):
        source = self.pipeline.source
        lag = {s: group_counts(self.client, s, source.group)[0] for s in source.streams}
        quotas = allocate(self.pipeline.batch_cap, lag)
        if not sum(quotas.values()):
            return None
        tasks = [(t.stream, t.quota, False) for t in plan(quotas)]
        task_df = self.spark.createDataFrame(self.spark.sparkContext.parallelize(tasks, len(tasks)),
                                             "stream string, quota long, reclaim boolean")
        ctx = self.ctx
        return stage(task_df, lambda batches, schema: claim_arrow(batches, ctx, schema), claim_schema(self.pipeline),
                     self.pipeline.payload_schema.id_field, str(self.scratch / "claimed"))

    def publish(self, *args, **kwargs):
        if self.on_claimed is not None:
            self.on_claimed()
        return super().publish(*args, **kwargs)


def one_after_another(cfg, pipeline, spark, batches: int) -> list[dict]:
    out = []
    for _ in range(batches):
        s = drain(cfg, pipeline, spark=spark)
        out.append({"seconds": s.seconds, "timings": s.timings})
    return out


def overlapped(cfg, pipeline, spark, batches: int) -> list[dict]:
    out, base = [], new_run_id()
    following, thread, box = None, None, {}
    for i in range(batches):
        run = following or Prefetching(cfg, pipeline, spark, run_id=f"{base}-{i}")
        started = time.monotonic()
        if thread is not None:
            thread.join()  # the seconds waited here are part of this batch's
            run.ahead = box.pop("staged")
        following = Prefetching(cfg, pipeline, spark, run_id=f"{base}-{i + 1}") if i + 1 < batches else None
        thread = None

        def claim_following(nxt=following):
            nonlocal thread
            if nxt is not None:
                thread = threading.Thread(target=lambda: box.__setitem__("staged", nxt.claim_new_entries()))
                thread.start()

        run.on_claimed = claim_following
        s = run.run()
        if s.outcome != "committed":
            raise RuntimeError(f"batch {s.batch} ended {s.outcome}: {s.error}")
        out.append({"seconds": round(time.monotonic() - started, 3), "timings": s.timings})
    return out


def read_back(cfg, pipeline, spark) -> dict:
    rows = spark.read.format("delta").load(str(cfg.target_path(pipeline)))
    client = valkey_client(cfg, pipeline)
    return {"rows": rows.count(), "distinct_ids": rows.select(pipeline.payload_schema.id_field).distinct().count(),
            "pending": sum(group_counts(client, s, pipeline.source.group)[1] for s in pipeline.source.streams)}


def main(workdir: str, batches: int, order: list[str]) -> dict:
    spark = get_spark("overlap-claim")
    spark.sparkContext.setLogLevel("ERROR")
    report = {"command": " ".join(["bench/overlap_claim.py", *sys.argv[1:]]), "runs": {}}
    for tag in order:
        cfg = load_config(f"{workdir}/{tag}.yaml")
        pipeline = cfg.pipelines[0]
        started = time.monotonic()
        way = overlapped if tag.startswith("after") else one_after_another
        batch_runs = way(cfg, pipeline, spark, batches)
        total = round(time.monotonic() - started, 2)
        report["runs"][tag] = {"seconds": total, "batches": batch_runs, **read_back(cfg, pipeline, spark)}
        print(tag, total, [b["seconds"] for b in batch_runs], file=sys.stderr, flush=True)
    return report


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], int(sys.argv[2]), sys.argv[3].split(",")), indent=1))

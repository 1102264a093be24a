"""Would claiming batch n+1 while batch n commits pay? (bench/pipeline_alternatives/README.md)

An experiment, not the drain's code path. In one Spark session it drains the same entries
(`bench/ab_compare/ab_setup_valkey.py` makes the configs, each with a consumer group and a lake of its own)
either batch after batch, as a catch-up task does ("before" configs), or with the claim of the next
batch started in a second thread as soon as a batch's own claim is done ("after" configs). That
claim reads only new entries (XREADGROUP, no XAUTOCLAIM), so it cannot take over the running
batch's entries. Every run's table is read back: rows, distinct ids, and nothing left pending.

    DELTADRAIN_HOME=/tmp/ddov DELTADRAIN_VALKEY_PORT=26982 .venv/bin/python bench/ab_compare/ab_setup_valkey.py WORKDIR 1600000
    DELTADRAIN_HOME=/tmp/ddov DELTADRAIN_VALKEY_PORT=26982 \\
        .venv/bin/python bench/pipeline_alternatives/overlap_claim.py WORKDIR 8 before1,after1,after2,before2 > out.json
"""

import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from deltadrain.config import load_config
from deltadrain.run.summary import new_run_id
from deltadrain.runtime.session import get_spark
from deltadrain.sources.valkey.claim import allocate
from deltadrain.sources.valkey.client import group_counts, valkey_client
from deltadrain.sources.valkey.drain import ValkeyDrain


class Prefetching(ValkeyDrain):
    """A run that, once its own claim is done and before its commit, starts the claim of the run
    after it (`following`: an executor and that run). A run whose claim was started so (`ahead`)
    waits for it in its claim step."""

    ahead = None
    following = None

    def claim_batch(self, quotas, reclaim=True, split=None):
        staged = self.ahead.result() if self.ahead is not None else None
        return staged if staged is not None else super().claim_batch(quotas, reclaim, split)

    def claim_new_entries(self):
        source = self.pipeline.source
        quotas = allocate(self.pipeline.batch_cap,
                          {s: group_counts(self.client, s, source.group)[0] for s in source.streams})
        return super().claim_batch(quotas, reclaim=False) if sum(quotas.values()) else None  # not self.ahead's wait

    def publish(self, *args, **kwargs):
        if self.following is not None:
            pool, after = self.following
            after.ahead = pool.submit(after.claim_new_entries)
        return super().publish(*args, **kwargs)


def drain_batches(cfg, pipeline, spark, batches: int, overlap: bool) -> list[dict]:
    base = new_run_id()
    runs = [Prefetching(cfg, pipeline, spark, run_id=f"{base}-{i}") for i in range(batches)]
    out = []
    with ThreadPoolExecutor(1) as pool:
        if overlap:
            for run, after in zip(runs, runs[1:], strict=False):
                run.following = (pool, after)
        for run in runs:
            s = run.run()
            if s.outcome != "committed":
                raise RuntimeError(f"batch {s.batch} ended {s.outcome}: {s.error}")
            out.append({"seconds": s.seconds, "timings": s.timings})
    return out


def read_back(cfg, pipeline, spark) -> dict:
    rows = spark.read.format("delta").load(str(cfg.target_path(pipeline)))
    client = valkey_client(cfg, pipeline)
    return {"rows": rows.count(), "distinct_ids": rows.select(pipeline.payload_schema.id_field).distinct().count(),
            "pending": sum(group_counts(client, s, pipeline.source.group)[1] for s in pipeline.source.streams)}


def run_order(app: str, script: str, workdir: str, batches: int, order: list[str], drain) -> dict:
    """Drain `batches` batches for each config tag in `order`, in one Spark session, with
    `drain(cfg, pipeline, spark, batches, after)` (after: the tag starts with "after"); time each
    run and read its table back. Shared by the A/B experiments of this directory."""
    spark = get_spark(app)
    spark.sparkContext.setLogLevel("ERROR")
    report = {"command": " ".join([script, workdir, str(batches), ",".join(order)]), "runs": {}}
    for tag in order:
        cfg = load_config(f"{workdir}/{tag}.yaml")
        pipeline = cfg.pipelines[0]
        started = time.monotonic()
        batch_runs = drain(cfg, pipeline, spark, batches, tag.startswith("after"))
        total = round(time.monotonic() - started, 2)
        report["runs"][tag] = {"seconds": total, "batches": batch_runs, **read_back(cfg, pipeline, spark)}
        print(tag, total, [b["seconds"] for b in batch_runs], file=sys.stderr, flush=True)
    return report


if __name__ == "__main__":
    report = run_order("overlap-claim", "bench/pipeline_alternatives/overlap_claim.py", sys.argv[1], int(sys.argv[2]),
                       sys.argv[3].split(","), drain_batches)
    print(json.dumps(report, indent=1))

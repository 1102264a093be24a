"""Reading a pipeline's Delta tables back: the ids in its target, its dead letters, and a log cleanup
that leaves a checkpoint reader without the commit files."""

from __future__ import annotations

import os
import time


def clean_up_delta_log(spark, target: str, version: int) -> None:
    """Age the table's log, then let Delta itself checkpoint and remove expired commit files; asserts
    that commit `version` is gone (so a checkpoint reader must do without its commitInfo)."""
    spark.sql(f"ALTER TABLE delta.`{target}` SET TBLPROPERTIES ('delta.logRetentionDuration' = 'interval 1 days', "
              "'delta.deletedFileRetentionDuration' = 'interval 1 days', 'delta.checkpointInterval' = '1')")
    log = os.path.join(target, "_delta_log")
    old = time.time() - 5 * 86400
    for name in os.listdir(log):
        os.utime(os.path.join(log, name), (old, old))
    spark.sql(f"ALTER TABLE delta.`{target}` SET TBLPROPERTIES ('deltadrain.test' = 'cleanup')")
    assert not os.path.exists(os.path.join(log, f"{version:020d}.json")), "cleanup did not run"


def target_ids(spark, cfg, pipeline) -> list[str]:
    from deltadrain.lake.delta import is_table

    path = str(cfg.target_path(pipeline))
    if not is_table(spark, path):
        return []
    return [r[0] for r in spark.read.format("delta").load(path).select(pipeline.payload_schema.id_field).collect()]


def dlq_rows(spark, cfg, pipeline) -> list:
    from deltadrain.lake.delta import is_table

    path = str(cfg.dlq_path(pipeline))
    if not is_table(spark, path):
        return []
    return spark.read.format("delta").load(path).collect()


def assert_dead_letters(dead: list, ids: list[str], bad) -> None:
    """The DLQ holds each message once; `bad` is how many, or exactly where they were produced
    (`ProduceResult.bad_places`): then a valid message dead-lettered in place of a malformed one
    does not pass for it. A DEAD message is not in the target as well."""
    keys = [(r.partition, r.position) for r in dead]
    assert len(keys) == len(set(keys)), "a message is twice in the DLQ"
    if isinstance(bad, int):
        assert len(dead) == bad
    else:
        assert set(keys) == set(bad), (f"dead-lettered but not produced bad {sorted(set(keys) - set(bad))[:5]}, "
                                       f"produced bad but not dead-lettered {sorted(set(bad) - set(keys))[:5]}")
    both = {r.message_id for r in dead if r.state == "DEAD" and r.message_id} & set(ids)
    assert not both, f"DEAD in the DLQ and published in the target: {sorted(both)[:5]}"

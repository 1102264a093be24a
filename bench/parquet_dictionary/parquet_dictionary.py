"""What Parquet's dictionary attempt on unique string columns costs a drain's MERGE
(bench/parquet_dictionary/README.md).

Parquet's writer starts every column chunk with a dictionary and falls back to plain encoding when
the dictionary does not pay; for a column whose values are all distinct (the message id, the
source position) the attempt buys nothing. parquet-java takes a per-column switch,
`parquet.enable.dictionary#COLUMN`, which Spark copies from the session conf into every write.

This script stages batches of rows shaped like the benchmark's target rows (the produce module's
event: a unique id, a customer out of 10 000, amount, quantity, status, event time, a padding note;
plus deltadrain's meta columns, whose position is unique too) as Parquet, as the claim tasks do. It
then MERGEs them one after another into one Delta table, insert-only, with the drain's own condition
(`commit.merge_condition`), alternating the switch off and on for those two columns batch by batch,
so both meet the same table sizes. Each MERGE is timed, and its files' sizes and the encodings of
both columns are read back, as is the table (every id once).

    DELTADRAIN_HOME=/tmp/dddict .venv/bin/python bench/parquet_dictionary/parquet_dictionary.py WORKDIR PAIRS ROWS > out.json
"""

import json
import shutil
import statistics
import sys
import time
from pathlib import Path

from deltadrain.dev.bench import target_shaped_rows
from deltadrain.run.commit import no_dictionary
from deltadrain.runtime.session import get_spark

UNIQUE_COLUMNS = ("event_id", "_dd_position")


def file_facts(table: Path, before: set[str]) -> dict:
    """Size and, per unique column, the encodings of the files one commit added."""
    import pyarrow.parquet as pq

    new = sorted(p for p in table.glob("*.parquet") if p.name not in before)
    encodings: dict[str, set[str]] = {c: set() for c in UNIQUE_COLUMNS}
    for path in new:
        meta = pq.ParquetFile(path).metadata
        names = [meta.schema.column(i).name for i in range(meta.num_columns)]
        for g in range(meta.num_row_groups):
            for column in UNIQUE_COLUMNS:
                encodings[column].update(meta.row_group(g).column(names.index(column)).encodings)
    return {"files": len(new), "bytes": sum(p.stat().st_size for p in new),
            "encodings": {c: sorted(e) for c, e in encodings.items()}}


def main(workdir: str, pairs: int, rows: int) -> dict:
    from delta.tables import DeltaTable

    from deltadrain.run.commit import merge_condition

    spark = get_spark("parquet-dictionary")
    spark.sparkContext.setLogLevel("ERROR")
    work = Path(workdir)
    shutil.rmtree(work, ignore_errors=True)
    table = work / "target"
    # The table holds two batches before the timed ones: a MERGE, not a creation, from the first on.
    for batch in (0, 1):
        target_shaped_rows(spark, work / "stage", batch, rows)
        spark.read.parquet(str(work / "stage")).write.format("delta").mode("append").save(str(table))
    out = {"command": " ".join(["bench/parquet_dictionary/parquet_dictionary.py", *sys.argv[1:]]), "rows": rows, "merges": []}
    for k in range(2 * pairs):
        batch = k + 2
        dictionary = (k // 2 + k) % 2 == 1  # off, on, on, off, off, on, ...: neither always goes first
        for column in UNIQUE_COLUMNS:
            spark.conf.set(no_dictionary(column), str(dictionary).lower())
        target_shaped_rows(spark, work / "stage", batch, rows)
        source = spark.read.parquet(str(work / "stage"))
        ids = source.agg({"event_id": "min"}).first()[0], source.agg({"event_id": "max"}).first()[0]
        before = {p.name for p in table.glob("*.parquet")}
        started = time.perf_counter()
        (DeltaTable.forPath(spark, str(table)).alias("t")
         .merge(source.alias("s"), merge_condition("event_id", None, ids))
         .whenNotMatchedInsertAll().execute())
        row = {"batch": batch, "dictionary": dictionary, "merge_s": round(time.perf_counter() - started, 3),
               **file_facts(table, before)}
        out["merges"].append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    for column in UNIQUE_COLUMNS:
        spark.conf.unset(no_dictionary(column))
    back = spark.read.format("delta").load(str(table)).agg({"event_id": "count"}).first()[0]
    distinct = spark.read.format("delta").load(str(table)).select("event_id").distinct().count()
    expected = (2 * pairs + 2) * rows
    out["read_back"] = {"rows": back, "distinct_ids": distinct, "expected": expected}
    if back != expected or distinct != expected:
        raise RuntimeError(f"read back {back} rows, {distinct} distinct ids; expected {expected}")
    for dictionary in (False, True):
        times = sorted(m["merge_s"] for m in out["merges"] if m["dictionary"] == dictionary)
        out[f"dictionary_{'on' if dictionary else 'off'}"] = {
            "merge_s": times, "median_s": round(statistics.median(times), 3),
            "bytes_mean": round(sum(m["bytes"] for m in out["merges"] if m["dictionary"] == dictionary)
                                / len(times))}
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])), indent=1))

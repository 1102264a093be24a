import os

import pytest

from deltadrain.cli import COMMANDS, build_parser


def test_every_subcommand_is_wired():
    parser = build_parser()
    for name in ("services", "produce", "drain", "status", "reap", "dlq", "bench", "jars", "demo"):
        assert name in COMMANDS
    args = parser.parse_args(["dlq", "list", "orders", "--error", "x", "--state", "all", "--json"])
    assert (args.command, args.pipeline, args.error, args.state, args.json) == ("dlq", "orders", "x", "all", True)
    args = parser.parse_args(["produce", "orders", "--count", "5", "--malformed-ratio", "0.5"])
    assert (args.count, args.malformed_ratio, args.seed) == (5, 0.5, 0)


def test_unknown_subcommand_is_refused():
    with pytest.raises(SystemExit):
        build_parser().parse_args(["explode"])


def test_unknown_pipeline_is_a_config_error_with_exit_2(capsys):
    from deltadrain.cli import main

    assert main(["drain", "nope"]) == 2
    err = capsys.readouterr().err
    assert "no pipeline named 'nope'" in err and "configured: orders, clicks" in err


def test_bench_rounds_apply_to_kafka_and_the_connect_executor_only_and_are_positive(capsys):
    from deltadrain.cli import main

    assert build_parser().parse_args(["bench", "--source", "kafka", "--rounds", "3"]).rounds == 3
    assert build_parser().parse_args(["bench", "--executor", "connect", "--rounds", "3"]).rounds == 3
    assert main(["bench", "--rounds", "2"]) != 0
    assert "--rounds applies to --source kafka and to --executor connect only" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["bench", "--source", "kafka", "--rounds", "0"])
    assert "--rounds: 0 is less than 1" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["bench", "--server-warm-up", "5"],
                                  ["bench", "--source", "kafka", "--executor", "connect", "--server-warm-up", "5"],
                                  ["bench", "--lake", "s3", "--server-warm-up", "5"]])
def test_bench_server_warm_up_is_refused_where_no_embedded_server_drains_valkey(argv, capsys):
    from deltadrain.cli import main

    assert main(argv) != 0  # refused before any service starts
    assert "--server-warm-up applies to the Valkey bench with --executor connect only" in capsys.readouterr().err


def test_bench_server_warm_up_takes_a_count_of_commits(capsys):
    from deltadrain.cli import main

    assert build_parser().parse_args(["bench", "--executor", "connect", "--server-warm-up", "40"]).server_warm_up == 40
    assert build_parser().parse_args(["bench"]).server_warm_up == 0
    with pytest.raises(SystemExit):
        main(["bench", "--executor", "connect", "--server-warm-up", "-1"])
    assert "--server-warm-up: -1 is less than 0" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["drain", "orders"], ["quality", "orders", "--owed"], ["maintain", "orders"],
                                  ["backfill", "orders", "--start", "a", "--end", "b"], ["replay", "orders"]])
def test_the_spark_commands_take_remote_alone_or_with_a_url_or_local(argv, capsys):
    parse = build_parser().parse_args
    assert (parse(argv).remote, parse(argv).local) == (None, False)  # the server when it is up, else local
    assert parse([*argv, "--remote"]).remote == "config"
    assert parse([*argv, "--remote", "sc://10.0.0.5:15002"]).remote == "sc://10.0.0.5:15002"
    assert parse([*argv, "--local"]).local
    with pytest.raises(SystemExit):
        parse([*argv, "--local", "--remote"])
    assert "not allowed with argument" in capsys.readouterr().err


def test_drain_max_batches_is_positive(capsys):
    from deltadrain.cli import main

    assert build_parser().parse_args(["drain", "orders", "--max-batches", "5"]).max_batches == 5
    assert build_parser().parse_args(["drain", "orders"]).max_batches == 1
    with pytest.raises(SystemExit) as exit_:
        main(["drain", "orders", "--max-batches", "0"])
    assert exit_.value.code == 2 and "--max-batches: 0 is less than 1" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "message"), [
    (["produce", "orders", "--count", "-5"], "--count: -5 is less than 1"),
    (["produce", "orders", "--count", "x"], "--count: 'x' is not a whole number"),
    (["produce", "orders", "--count", "3", "--malformed-ratio", "2"], "--malformed-ratio: 2.0 is not within 0..1"),
    (["metrics", "orders", "--last", "-1"], "--last: -1 is less than 1"),
    (["dlq", "list", "orders", "--limit", "0"], "--limit: 0 is less than 1"),
    (["drain", "orders", "--run-id", "../../home"], "--run-id: run id '../../home': use 1-200 letters"),
    (["drain", "orders", "--run-id", ".."], "--run-id: run id '..'"),
    (["drain", "orders", "--run-id", "/"], "--run-id: run id '/'"),
    (["quality", "orders", "--owed", "--settle", "-1"], "--settle: -1 is less than 0"),
    (["quality", "orders", "--table", "--settle", "60"], "--settle goes with --owed"),
])
def test_bad_flag_values_exit_2_with_one_line(argv, message, capsys):
    from deltadrain.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and message in err and "Traceback" not in err


def test_a_bad_log_level_is_a_one_line_error(monkeypatch, tmp_path, capsys):
    from deltadrain.cli import main

    monkeypatch.setenv("DELTADRAIN_LOG_LEVEL", "verbose")
    assert main(["--config", str(tmp_path / "none.yaml"), "drain", "orders"]) == 1
    assert "DELTADRAIN_LOG_LEVEL='VERBOSE' is not a log level; use one of DEBUG" in capsys.readouterr().err


def test_a_run_id_is_one_directory_under_staging(tmp_path, monkeypatch):
    from deltadrain.paths import staging_dir

    monkeypatch.setenv("DELTADRAIN_HOME", str(tmp_path))
    assert staging_dir("af-ingest_orders-manual__2026-11-26T10_00_00-try1") == (
        tmp_path / "staging" / "af-ingest_orders-manual__2026-11-26T10_00_00-try1")
    for bad in ("/", "..", ".", "../x", "a/b", "", "run\n", "x" * 201):
        with pytest.raises(ValueError, match="run id"):
            staging_dir(bad)


def test_stale_claims_are_flagged_by_the_sources_own_limit():
    """Valkey: idle over min_idle_ms (reclaimable); Kafka: older than the drain task's execution_timeout."""
    from pathlib import Path

    from deltadrain.config import load_config
    from deltadrain.observe.status import mark_stale
    from deltadrain.sources import source_of

    cfg = load_config(Path(__file__).resolve().parents[2] / "config" / "pipelines.yaml")
    valkey = next(p for p in cfg.pipelines if p.source.kind == "valkey")
    kafka = next(p for p in cfg.pipelines if p.source.kind == "kafka")
    assert source_of(valkey).stale_after_ms(valkey) == valkey.min_idle_ms
    assert source_of(kafka).stale_after_ms(kafka) == kafka.airflow.execution_timeout.total_seconds() * 1000
    counts = {"claimed_by": {"a": {"claimed": 5, "idle_ms": 1000}, "b": {"claimed": 7, "idle_ms": 1001},
                             "c": {"claimed": 2, "idle_ms": 5000}}}
    mark_stale(counts, 1000)
    assert {k: v["stale"] for k, v in counts["claimed_by"].items()} == {"a": False, "b": True, "c": True}
    assert (counts["STALE_CLAIMED"], counts["stale_after_ms"]) == (9, 1000)
    assert mark_stale({"claimed_by": {}}, 10)["STALE_CLAIMED"] == 0
    assert "execution_timeout (1000 ms)" in source_of(kafka).stale_reason(1000)
    assert "reaper" in source_of(valkey).stale_reason(1000)


# What Py4J reports when Hadoop finds a commit file that does not match its side checksum (the
# lines that matter, from a real read of such a table: tests/integration/test_log_store.py).
CHECKSUM_FAILURE = (
    "An error occurred while calling o61.count.\n"
    ": org.apache.spark.SparkException: Job aborted due to stage failure: ...\n"
    "Caused by: org.apache.hadoop.fs.ChecksumException: Checksum error: "
    "file:/lake/dlq/orders/_delta_log/00000000000000000002.json at 0 exp: -1380157321 got: -150498726\n"
    "\tat org.apache.hadoop.fs.FSInputChecker.readChecksumChunk(FSInputChecker.java:308)\n")


def test_a_commit_failing_its_checksum_is_explained_with_the_file_to_delete(monkeypatch, capsys):
    from deltadrain import cli
    from deltadrain.lake.delta import damaged_log

    hint = damaged_log(RuntimeError(CHECKSUM_FAILURE))
    assert "delete /lake/dlq/orders/_delta_log/.00000000000000000002.json.crc" in hint
    assert "not Delta's 00000000000000000002.crc" in hint and "backfill" in hint
    assert damaged_log(RuntimeError("ChecksumException: Checksum error: file:/data/part-0001.parquet")) is None
    assert damaged_log(RuntimeError("An error occurred while calling o61.count.")) is None

    def status(args):
        raise RuntimeError(CHECKSUM_FAILURE)

    monkeypatch.setitem(cli.COMMANDS, "status", status)
    assert cli.main(["status", "orders"]) == 1
    assert capsys.readouterr().err == f"deltadrain: error: {hint}\n"

    def other(args):
        raise RuntimeError("something else")

    monkeypatch.setitem(cli.COMMANDS, "status", other)
    with pytest.raises(RuntimeError, match="something else"):
        cli.main(["status", "orders"])


@pytest.fixture
def closed_port() -> int:
    from tests.conftest import free_port

    return free_port()  # bound and closed again: nothing listens there


@pytest.mark.parametrize("argv", [["reap", "orders"], ["reap"], ["produce", "orders", "--count", "3", "--no-progress"]])
def test_an_unreachable_valkey_is_one_line_with_its_address_and_the_fix(argv, closed_port, monkeypatch, capsys):
    from deltadrain.cli import main

    monkeypatch.setenv("DELTADRAIN_VALKEY_PORT", str(closed_port))
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"deltadrain: error: cannot reach Valkey at 127.0.0.1:{closed_port} for pipeline 'orders'")
    assert "refused" in err and " deltadrain services up`" in err and "DELTADRAIN_VALKEY_PORT" in err
    assert len(err.strip().splitlines()) == 1


def test_an_unreachable_valkey_of_a_configured_url_points_at_the_config_file(tmp_path, closed_port, capsys):
    import yaml

    from deltadrain.cli import main
    from tests.conftest import ROOT

    data = yaml.safe_load((ROOT / "config" / "pipelines.yaml").read_text())
    data["pipelines"][0]["source"]["url"] = f"valkey://127.0.0.1:{closed_port}/0"
    path = tmp_path / "pipelines.yaml"
    path.write_text(yaml.safe_dump(data))
    assert main(["--config", str(path), "reap", "orders"]) == 1
    err = capsys.readouterr().err
    assert f"cannot reach Valkey at 127.0.0.1:{closed_port}" in err
    assert f"check source.url of pipeline 'orders' in {path}" in err and "services up" not in err


def test_an_unreachable_kafka_is_one_line_with_its_address_and_the_fix(closed_port, monkeypatch, capsys):
    from deltadrain.cli import main

    monkeypatch.setenv("DELTADRAIN_KAFKA_PORT", str(closed_port))
    assert main(["produce", "clicks", "--count", "3", "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"deltadrain: error: cannot reach Kafka at 127.0.0.1:{closed_port} for pipeline 'clicks'")
    assert " deltadrain services up`" in err and "DELTADRAIN_KAFKA_PORT" in err


def test_reap_of_a_kafka_pipeline_is_refused_clearly(capsys):
    from deltadrain.cli import main

    assert main(["reap", "clicks"]) == 1
    assert "pipeline 'clicks' reads Kafka; reap is for Valkey pipelines only" in capsys.readouterr().err


def test_a_refused_valkey_login_points_at_the_secret_not_at_services_up(cfg):
    import valkey.exceptions

    from deltadrain.sources.connections import unreachable_source

    try:
        raise RuntimeError("claiming failed") from valkey.exceptions.AuthenticationError("invalid password")
    except RuntimeError as exc:
        line = unreachable_source(exc, cfg, [cfg.pipeline("orders")])
    assert line.startswith("Valkey at 127.0.0.1:") and "refused the login of pipeline 'orders'" in line
    assert "password_env/connection_id" in line and "services up" not in line
    assert unreachable_source(ValueError("not a connection"), cfg, []) is None


def test_maintain_names_pipelines_or_the_shared_tables_and_refuses_an_unknown_one_before_spark(capsys):
    from deltadrain.cli import main

    parser = build_parser()
    args = parser.parse_args(["maintain", "orders", "clicks", "--json"])
    assert (args.pipeline, args.shared, args.json) == (["orders", "clicks"], False, True)
    assert parser.parse_args(["maintain", "--shared"]).pipeline == []
    assert main(["maintain", "orders", "nope"]) == 2  # a config error, before any Spark session starts
    assert "no pipeline named 'nope'" in capsys.readouterr().err


def test_what_a_child_process_prints_inside_stdout_to_stderr_stays_out_of_stdout(capfd):
    import subprocess
    import sys

    from deltadrain.cli import stdout_to_stderr

    with stdout_to_stderr():  # as the Spark JVM, started inside it, inherits descriptor 1
        subprocess.run([sys.executable, "-c", "print('Deleted 3 files')"], check=True)
    print('{"ok": true}')
    out, err = capfd.readouterr()
    assert out == '{"ok": true}\n' and "Deleted 3 files" in err


def status_output(monkeypatch, capsys, pipeline: str, source: str, **fields) -> str:
    """What `deltadrain status PIPELINE` prints for a status of `source` with `fields` set."""
    import deltadrain.cli as cli
    import deltadrain.cli.pipelines as pipelines
    import deltadrain.observe.status as status
    from deltadrain.config import load_config
    from deltadrain.paths import PROJECT_ROOT

    cfg = load_config(PROJECT_ROOT / "config" / "pipelines.yaml")
    st = {"pipeline": pipeline, "source": source, "PENDING": 5, "CLAIMED": 0, "claimed_by": {}, "PUBLISHED": 16,
          "DEAD": 0, "REPLAYED": 0, "gaps": [], "partitions": {}, "last_batch": None, "last_runs": [],
          "checkpoint": {"batch": 1, "table_version": 1, "positions": {}}, **fields}
    monkeypatch.setattr(pipelines, "_pipeline", lambda args: (cfg, cfg.pipeline(pipeline)))
    monkeypatch.setattr(status, "pipeline_status", lambda cfg, pipeline: st)
    assert cli.main(["status", pipeline]) == 0
    return capsys.readouterr().out


def test_kafka_status_names_the_ranges_under_suspicion(monkeypatch, capsys):
    out = status_output(monkeypatch, capsys, "clicks", "kafka",
                        dead_runs=[{"partition": 0, "offsets": [16, 24], "runs": 2, "alone": 0},
                                   {"partition": 0, "offsets": [24, 25], "runs": 4, "alone": 2}])
    assert ("UNDER SUSPICION: partition 0 offsets [16, 24) (8 offsets) were read by 2 runs that died before "
            "committing, 0 of them with one message alone; the next runs read it half at a time (max_retries "
            "deaths alone: a dead letter)") in out
    assert "partition 0 offsets [24, 25) (1 offsets) were read by 4 runs that died before committing, 2 of them" in out


def test_valkey_status_names_the_entries_under_suspicion(monkeypatch, capsys):
    out = status_output(monkeypatch, capsys, "orders", "valkey", CLAIMED=12, splits=[
        {"partition": "s0", "ids": ["5-0", "8-0"], "entries": 4, "deliveries": 4, "kind": "suspect", "alone": 0},
        {"partition": "s0", "ids": ["9-0", "17-0"], "entries": 8, "deliveries": 2, "kind": "rest", "alone": 0},
        {"partition": "s0", "ids": ["20-0", "20-0"], "entries": 1, "deliveries": 6, "kind": "suspect", "alone": 2}])
    assert ("UNDER SUSPICION: stream s0 ids 5-0 .. 8-0 (4 entries, delivered 4 times, 0 runs died reading one "
            "alone): runs died on them before committing; the next runs read them half at a time (max_retries "
            "deaths alone: a dead letter)") in out
    assert "stream s0 ids 9-0 .. 17-0 (8 entries, delivered 2 times, the untried half of a split, 0 runs" in out
    assert "stream s0 ids 20-0 .. 20-0 (1 entries, delivered 6 times, 2 runs died reading one alone)" in out


def test_status_names_the_batches_that_changed_the_tables_schema(monkeypatch, capsys):
    out = status_output(monkeypatch, capsys, "clicks", "kafka", schema_changes=[
        {"batch": 2, "table_version": 3, "at": None, "added_columns": {"coupon": "string", "score": "double"},
         "widened_columns": {"quantity": "int -> long"}}])
    assert "  schema: batch 2 (table version 3) added coupon string, added score double, widened quantity int -> long\n" in out


@pytest.mark.parametrize(("flag", "warm"), [([], True), (["--no-warm-up"], False)])
def test_services_up_warms_a_connect_server_it_starts_unless_told_not_to(flag, warm, monkeypatch, capsys):
    from deltadrain.cli import main
    from deltadrain.dev import services

    calls = []
    monkeypatch.setattr(services, "up", lambda cfg, only, *, warm: calls.append((only, warm)) or [])
    assert main(["services", "up", "--only", "spark_connect", *flag, "--json"]) == 0
    assert calls == [(["spark_connect"], warm)]


def test_a_command_prints_next_commands_with_the_config_it_was_given_and_leaves_the_environment(
        tmp_path, monkeypatch, capsys):
    from deltadrain.cli import COMMANDS, main
    from deltadrain.paths import command_line

    monkeypatch.setenv("DELTADRAIN_CONFIG", "/elsewhere/pipelines.yaml")
    config = tmp_path / "pipelines.yaml"
    monkeypatch.setitem(COMMANDS, "jars", lambda args: print(command_line("services up")) or 0)
    assert main(["--config", str(config), "jars"]) == 0
    assert f"--config {config}" in capsys.readouterr().out
    assert os.environ["DELTADRAIN_CONFIG"] == "/elsewhere/pipelines.yaml"

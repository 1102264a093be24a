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


def test_bench_rounds_apply_to_kafka_only_and_are_positive(capsys):
    from deltadrain.cli import main

    assert build_parser().parse_args(["bench", "--source", "kafka", "--rounds", "3"]).rounds == 3
    assert main(["bench", "--rounds", "2"]) != 0
    assert "--rounds applies to --source kafka only" in capsys.readouterr().err
    assert main(["bench", "--source", "kafka", "--rounds", "0"]) != 0
    assert "at least 1, got 0" in capsys.readouterr().err


def test_drain_max_batches_is_positive(capsys):
    from deltadrain.cli import main

    assert build_parser().parse_args(["drain", "orders", "--max-batches", "5"]).max_batches == 5
    assert build_parser().parse_args(["drain", "orders"]).max_batches == 1
    assert main(["drain", "orders", "--max-batches", "0"]) != 0
    assert "--max-batches must be at least 1, got 0" in capsys.readouterr().err

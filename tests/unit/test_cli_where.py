"""Where a CLI command's Spark work runs (`cli.where`), and the commands deltadrain prints for a user to
run next (`paths.command_line`)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from deltadrain.cli.where import choose, configured_server, place_of
from deltadrain.errors import PrerequisiteError
from deltadrain.paths import DEFAULT_CONFIG, command_line

SERVER = "sc://127.0.0.1:15012"
START = "deltadrain services up"


def where(*, local=False, remote=None, executor="connect", server=SERVER, answers=True, note=""):
    return choose(local=local, remote=remote, executor=executor, server=server, answers=answers, start_it=START,
                  server_note=note)


def test_the_server_when_it_answers_else_a_local_driver_that_says_how_to_start_one():
    assert where() == ("sc://127.0.0.1:15012", "on the Spark Connect server at 127.0.0.1:15012")
    down = where(answers=False)
    assert down.url is None
    assert down.line == "in a local driver: no server up — `deltadrain services up` starts one"


def test_local_wins_over_a_server_that_is_up_and_remote_over_the_config():
    assert where(local=True) == (None, "in a local driver (--local)")
    # A server named on the command line is used whatever the config says; the session then fails
    # when it does not answer (connect_session), rather than run somewhere else than asked.
    for executor in ("connect", "submit"):
        assert where(remote="sc://10.0.0.5:15002", executor=executor, answers=False) == (
            "sc://10.0.0.5:15002", "on the Spark Connect server at 10.0.0.5:15002")


def test_spark_executor_submit_keeps_the_cli_in_a_local_driver():
    assert where(executor="submit") == (None, "in a local driver: the config's spark.executor is submit")


def test_a_server_of_the_users_own_that_does_not_answer_is_named_not_the_embedded_fix():
    place = where(server="sc://spark.internal:15002", answers=False, note="Airflow connection 'my_connect'")
    assert place.url is None
    assert place.line == ("in a local driver: no server answers at spark.internal:15002 "
                          "(Airflow connection 'my_connect')")
    missing = where(server=None, answers=False, note="Airflow has no connection 'my_connect' (spark.connect_conn_id)")
    assert missing == (None, "in a local driver: Airflow has no connection 'my_connect' (spark.connect_conn_id)")


def _cfg(tmp_path, spark: dict | None = None):
    import yaml

    from deltadrain.config import load_config

    data = {"services": {"spark_connect_port": 15099}, "spark": spark or {},
            "pipelines": [{"name": "orders", "source": {"kind": "valkey", "streams": ["s"], "group": "g"},
                           "target": {"path": "t"}, "schema": {"id_field": "id", "fields": {"id": "string"}}}]}
    path = tmp_path / "pipelines.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_config(path)


def test_the_config_names_the_embedded_server_or_a_connection(tmp_path, monkeypatch):
    monkeypatch.delenv("DELTADRAIN_SPARK_CONNECT_PORT", raising=False)
    monkeypatch.delenv("AIRFLOW_CONN_SPARK_CONNECT", raising=False)
    cfg = _cfg(tmp_path)
    assert configured_server(cfg) == ("sc://127.0.0.1:15099", "")
    # A connection with only a host and a port is read without Airflow.
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_CONNECT", '{"conn_type": "spark_connect", "host": "10.1.2.3", "port": 15002}')
    assert configured_server(cfg) == ("sc://10.1.2.3:15002", "Airflow connection 'spark_connect'")


def test_no_server_up_gives_a_local_driver_and_remote_alone_the_configs_server(tmp_path, monkeypatch):
    import socket

    monkeypatch.delenv("AIRFLOW_CONN_SPARK_CONNECT", raising=False)
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("DELTADRAIN_SPARK_CONNECT_PORT", str(port))
    cfg = _cfg(tmp_path)
    args = argparse.Namespace(local=False, remote=None)
    place = place_of(args, cfg)
    assert place.url is None and "no server up" in place.line
    # The fix carries the config and the home it ran with (the suite's, not the defaults).
    assert f"deltadrain --config {cfg.source_file} services up` starts one" in place.line
    assert "— `DELTADRAIN_HOME=/" in place.line
    assert place_of(argparse.Namespace(local=False, remote="config"), cfg).url == f"sc://127.0.0.1:{port}"
    assert place_of(argparse.Namespace(local=False, remote="embedded"), cfg).url == f"sc://127.0.0.1:{port}"
    with socket.socket() as listener:  # now one answers
        listener.bind(("127.0.0.1", port))
        listener.listen()
        assert place_of(args, cfg).url == f"sc://127.0.0.1:{port}"
        assert place_of(argparse.Namespace(local=True, remote=None), cfg).url is None
    submit = _cfg(tmp_path, {"executor": "submit"})
    assert place_of(args, submit).url is None


def test_remote_alone_fails_when_the_configs_connection_is_missing(tmp_path, monkeypatch):
    from deltadrain.secrets import use_connection_store

    monkeypatch.delenv("AIRFLOW_CONN_MY_CONNECT", raising=False)
    use_connection_store(None)
    cfg = _cfg(tmp_path, {"connect_conn_id": "my_connect"})
    with pytest.raises(PrerequisiteError, match="no connection 'my_connect'"):
        place_of(argparse.Namespace(local=False, remote="config"), cfg)


def test_printed_commands_carry_a_config_and_home_that_are_not_the_defaults(tmp_path, monkeypatch):
    from deltadrain.paths import DEFAULT_HOME

    monkeypatch.delenv("DELTADRAIN_CONFIG", raising=False)
    monkeypatch.setenv("DELTADRAIN_HOME", str(DEFAULT_HOME))
    assert command_line("status orders", DEFAULT_CONFIG) == "deltadrain status orders"
    assert command_line("status orders") == "deltadrain status orders"
    other = tmp_path / "my pipelines.yaml"
    monkeypatch.setenv("DELTADRAIN_HOME", str(tmp_path / "home"))
    monkeypatch.chdir("/")
    assert command_line("status orders", other) == (
        f"DELTADRAIN_HOME={tmp_path}/home deltadrain --config '{other}' status orders")
    # Relative to the current directory when the files lie under it; $DELTADRAIN_CONFIG is not the default.
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DELTADRAIN_CONFIG", str(tmp_path / "c.yaml"))
    assert command_line("dlq list orders", program=".venv/bin/deltadrain") == (
        "DELTADRAIN_HOME=home .venv/bin/deltadrain --config c.yaml dlq list orders")
    assert Path(DEFAULT_CONFIG).name == "pipelines.yaml"

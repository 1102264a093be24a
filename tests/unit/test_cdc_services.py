"""The change-data-capture services' decisions, without starting them: how PostgreSQL is started (and
as whom), what the Debezium worker and connector are told, when they run (tests/integration/test_cdc_services.py
runs them)."""

from __future__ import annotations

import pwd
from pathlib import Path

import pytest

from deltadrain.config import load_config
from deltadrain.config.embedded import debezium_topic, ports
from deltadrain.config.models import ServicesConfig
from deltadrain.dev import services
from deltadrain.dev.services import debezium, postgres
from deltadrain.errors import PrerequisiteError, ServiceError

ACCOUNT = pwd.struct_passwd(("postgres", "x", 101, 104, "", "/var/lib/postgresql", "/bin/sh"))


def test_postgres_as_root_runs_in_a_user_namespace_as_an_ordinary_account(monkeypatch):
    monkeypatch.setattr(postgres.shutil, "which", lambda name, **_: f"/usr/bin/{name}")
    cmd = ["/pg/bin/postgres", "-D", "/data"]
    assert postgres.unprivileged(cmd, euid=0, account=ACCOUNT) == [
        "/usr/bin/unshare", "--user", "--map-user=101", "--map-group=104", *cmd]
    assert postgres.unprivileged(cmd, euid=1000, account=ACCOUNT) == cmd
    monkeypatch.setattr(postgres.shutil, "which", lambda name, **_: None)
    with pytest.raises(PrerequisiteError, match="refuses to run as root"):
        postgres.unprivileged(cmd, euid=0, account=ACCOUNT)


def test_postgres_listens_on_loopback_with_the_logical_wal():
    cmd = postgres.server_command(Path("/pg/bin"), Path("/home/data"), 25432)
    settings = dict(cmd[i + 1].split("=", 1) for i, arg in enumerate(cmd) if arg == "-c")
    assert cmd[:3] == ["/pg/bin/postgres", "-D", "/home/data"]
    assert settings["listen_addresses"] == "127.0.0.1" and settings["port"] == "25432"
    assert settings["unix_socket_directories"] == ""
    assert settings["wal_level"] == "logical"
    assert int(settings["max_replication_slots"]) >= 1 and int(settings["max_wal_senders"]) >= 1


def test_the_newest_postgres_server_is_chosen_and_a_missing_one_names_the_fix(tmp_path, monkeypatch):
    for major in ("9.6", "15", "13"):
        (tmp_path / major / "bin").mkdir(parents=True)
        (tmp_path / major / "bin" / "postgres").touch()
    monkeypatch.setattr(postgres, "DEBIAN_PREFIX", tmp_path)
    assert postgres.postgres_bindir() == tmp_path / "15" / "bin"
    monkeypatch.setattr(postgres, "DEBIAN_PREFIX", tmp_path / "none")
    monkeypatch.setattr(postgres.shutil, "which", lambda name, **_: None)
    with pytest.raises(PrerequisiteError, match="ensure-postgres"):
        postgres.postgres_bindir()


def test_the_worker_writes_json_with_schemas_and_serves_its_api_on_loopback_behind_a_login():
    worker = debezium.worker_properties(kafka_port=19092, rest_port=18083, offsets="/h/offsets.dat")
    assert worker["bootstrap.servers"] == "127.0.0.1:19092"
    for side in ("key", "value"):
        assert worker[f"{side}.converter"] == "org.apache.kafka.connect.json.JsonConverter"
        assert worker[f"{side}.converter.schemas.enable"] == "true"
    assert worker["listeners"] == "http://127.0.0.1:18083"
    assert worker["rest.extension.classes"].endswith("BasicAuthSecurityRestExtension")
    assert worker["offset.storage.file.filename"] == "/h/offsets.dat"


def test_the_connector_reads_the_publication_and_never_holds_the_password():
    props = debezium.connector_properties(postgres_port=15432, secrets="/h/secrets.properties", tables=[])
    assert props["database.password"] == "${file:/h/secrets.properties:postgres_password}"
    assert props["plugin.name"] == "pgoutput" and props["publication.autocreate.mode"] == "disabled"
    assert props["database.hostname"] == "127.0.0.1" and props["database.port"] == "15432"
    assert "table.include.list" not in props  # every table
    chosen = debezium.connector_properties(postgres_port=1, secrets="/s", tables=["public.a", "shop.b"])
    assert chosen["table.include.list"] == "public.a,shop.b"
    assert debezium_topic("public.a") == f"{props['topic.prefix']}.public.a"


def test_a_setting_that_a_properties_file_would_read_otherwise_is_refused():
    assert debezium.properties({"a": "b c", "d": "${file:/x:y}"}) == "a=b c\nd=${file:/x:y}\n"
    for bad in ("C:\\x", "two\nlines"):
        with pytest.raises(ServiceError):
            debezium.properties({"offsets": bad})


@pytest.mark.parametrize(("status", "running"), [
    ({"connector": {"state": "RUNNING"}, "tasks": [{"id": 0, "state": "RUNNING"}]}, True),
    ({"connector": {"state": "RUNNING"}, "tasks": [{"id": 0, "state": "FAILED"}]}, False),
    ({"connector": {"state": "RUNNING"}, "tasks": []}, False),
    ({"connector": {"state": "UNASSIGNED"}, "tasks": [{"id": 0, "state": "RUNNING"}]}, False),
])
def test_the_connector_is_healthy_when_it_and_every_task_run(status, running):
    assert debezium.connector_running(status) is running


def test_postgres_and_debezium_run_only_when_named_and_stop_with_the_rest():
    cfg = load_config()
    assert not {"postgres", "debezium"} & set(services.select(None, cfg))
    # Named in any order, started after the broker and the database it needs; stopped before them.
    assert services.select(["debezium", "postgres", "kafka"], cfg) == ["kafka", "postgres", "debezium"]
    assert {"postgres", "debezium"} <= set(services.select(None, every=True))


def test_ports_and_tables_come_from_the_services_section_or_the_environment(monkeypatch):
    cfg = load_config()
    monkeypatch.setenv("DELTADRAIN_POSTGRES_PORT", "25432")
    monkeypatch.setenv("DELTADRAIN_DEBEZIUM_PORT", "28083")
    assert (ports(cfg).postgres, ports(cfg).debezium) == (25432, 28083)
    assert ServicesConfig(debezium_tables=["public.orders"]).debezium_tables == ["public.orders"]
    for bad in ("orders", "public.orders;drop", "public.*"):
        with pytest.raises(ValueError):
            ServicesConfig(debezium_tables=[bad])

from pathlib import Path

import pytest
import yaml

from deltadrain.config import load_config, parse_config
from deltadrain.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "config" / "pipelines.yaml"


def example() -> dict:
    return yaml.safe_load(EXAMPLE.read_text())


def error_of(data: dict, name: str = "pipes.yaml") -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(data, Path(name))
    return str(info.value)


def test_example_config_has_one_valkey_and_one_kafka_pipeline():
    cfg = load_config(EXAMPLE)
    kinds = sorted(p.source.kind for p in cfg.pipelines)
    assert kinds == ["kafka", "valkey"]
    orders = cfg.pipeline("orders")
    assert orders.max_retries == 3 and orders.min_idle_ms == 60_000
    assert orders.payload_schema.id_field == "event_id"
    assert cfg.target_path(orders).is_absolute()


def test_defaults_apply_when_fields_are_omitted():
    data = example()
    for key in ("max_retries", "min_idle_ms", "batch_cap"):
        data["pipelines"][0].pop(key, None)
    p = parse_config(data, Path("x.yaml")).pipelines[0]
    assert (p.max_retries, p.min_idle_ms, p.batch_cap) == (3, 60_000, 10_000)


def test_error_names_file_pipeline_and_field():
    data = example()
    data["pipelines"][1]["source"]["topic"] = ""
    msg = error_of(data, "conf/pipes.yaml")
    assert "conf/pipes.yaml" in msg and "pipeline 'clicks'" in msg and "field 'source.topic'" in msg


def test_every_error_is_listed_not_only_the_first():
    data = example()
    data["pipelines"][0]["batch_cap"] = 0
    data["pipelines"][1]["max_retries"] = -1
    msg = error_of(data)
    assert "pipeline 'orders', field 'batch_cap'" in msg
    assert "pipeline 'clicks', field 'max_retries'" in msg


@pytest.mark.parametrize("key", ["password", "sasl_password", "secret"])
def test_secrets_in_yaml_are_refused_and_the_way_out_is_named(key):
    data = example()
    data["pipelines"][0]["source"][key] = "hunter2"
    msg = error_of(data)
    assert "pipeline 'orders'" in msg and "password_env" in msg and "hunter2" not in msg


def test_password_inside_url_is_refused():
    data = example()
    data["pipelines"][0]["source"]["url"] = "valkey://user:hunter2@host:6379/0"
    msg = error_of(data)
    assert "field 'source.url'" in msg and "hunter2" not in msg


@pytest.mark.parametrize("url", ["redis://host:6379/0?password=hunter2", "valkey://host:6379/0?db=0&Password=hunter2",
                                 "rediss://host:6379?username=bob&password=hunter2", "valkey://host?username=bob"])
def test_credentials_in_the_url_query_are_refused(url):
    # valkey-py's from_url takes ?password= and ?username= as connection arguments.
    data = example()
    data["pipelines"][0]["source"]["url"] = url
    msg = error_of(data, "conf/pipes.yaml")
    assert "conf/pipes.yaml" in msg and "pipeline 'orders', field 'source.url'" in msg
    assert "query string" in msg and "password_env" in msg and "connection_id" in msg and "hunter2" not in msg


def test_a_url_with_harmless_query_parameters_is_accepted():
    data = example()
    data["pipelines"][0]["source"]["url"] = "valkey://host:6379/0?socket_timeout=5&db=1"
    assert parse_config(data, Path("x.yaml")).pipeline("orders").source.url.endswith("?socket_timeout=5&db=1")


def test_unknown_field_and_bad_types_are_named():
    data = example()
    data["pipelines"][0]["batchcap"] = 5
    data["pipelines"][0]["schema"]["fields"]["amount"] = "money"
    msg = error_of(data)
    assert "field 'batchcap'" in msg
    assert "field 'schema.fields'" in msg and "money" in msg


def test_id_field_must_be_a_declared_field():
    data = example()
    data["pipelines"][0]["schema"]["id_field"] = "nope"
    assert "field 'schema'" in error_of(data) and "nope" in error_of(data)


def test_id_field_must_be_text():
    data = example()
    data["pipelines"][0]["schema"]["fields"]["event_id"] = "long"
    assert "field 'schema'" in error_of(data) and "must be of type string" in error_of(data)


def test_unnamed_pipeline_is_named_by_position():
    data = example()
    del data["pipelines"][1]["name"]
    assert "pipeline '#2', field 'name'" in error_of(data)


def test_duplicate_pipeline_names():
    data = example()
    data["pipelines"][1]["name"] = "orders"
    assert "repeated: ['orders']" in error_of(data)


def test_sasl_needs_a_mechanism():
    data = example()
    data["pipelines"][1]["source"]["security"] = {"protocol": "SASL_SSL"}
    assert "field 'source.security'" in error_of(data)


def test_missing_file_and_invalid_yaml_name_the_file(tmp_path):
    with pytest.raises(ConfigError, match="nope.yaml: config file not found"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("pipelines:\n  - name: [unclosed\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: line \d+: not valid YAML"):
        load_config(bad)


def test_unknown_pipeline_lists_the_configured_ones():
    cfg = load_config(EXAMPLE)
    with pytest.raises(ConfigError, match="configured: orders, clicks"):
        cfg.pipeline("nope")


def test_two_pipelines_with_one_target_table_are_refused():
    data = example()
    data["pipelines"][1]["target"]["path"] = data["pipelines"][0]["target"]["path"] + "/"  # the same table
    msg = error_of(data, "conf/pipes.yaml")
    assert msg.startswith("conf/pipes.yaml: pipeline 'clicks', field 'target.path'")
    assert "already the target of pipeline 'orders'" in msg


@pytest.mark.parametrize(("path", "other"), [
    ("_deltadrain/dlq/clicks", "deltadrain's own tables"), ("_deltadrain", "deltadrain's own tables"),
    (".", "deltadrain's own tables"), ("orders/inner", "inside or around the target of pipeline 'orders'")])
def test_a_target_inside_or_around_another_table_is_refused(path, other):
    # VACUUM of a table around another would delete that one's files; a target on a DLQ would drain into it.
    data = example()
    data["pipelines"][0]["target"]["path"] = "orders"
    data["pipelines"][1]["target"]["path"] = path
    msg = error_of(data, "conf/pipes.yaml")
    assert msg.startswith("conf/pipes.yaml: pipeline 'clicks', field 'target.path'") and other in msg


@pytest.mark.parametrize("url", ["redis://u:hunter/2@host/0", "redis://:hunter2@host:6379/0",
                                 "valkey://host:6379/0#password=hunter2", "redis://u:hunter#x@host/0"])
def test_a_password_the_url_hides_with_separators_is_refused(url):
    data = example()
    data["pipelines"][0]["source"]["url"] = url
    msg = error_of(data)
    assert "pipeline 'orders', field 'source.url'" in msg and "hunter" not in msg


@pytest.mark.parametrize(("text", "message"), [
    ("pipelines:\n  - name: orders\n    batch_cap: 5\n    batch_cap: 7\n", "line 4: not valid YAML: key 'batch_cap' "
                                                                          "appears twice"),
    ("pipelines:\n  - name: a\n    target: {path: x}\n    target: {path: y}\n", "key 'target' appears twice"),
])
def test_a_key_given_twice_is_refused_not_silently_replaced(tmp_path, text, message):
    path = tmp_path / "dup.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message) as info:
        load_config(path)
    assert str(info.value).startswith(str(path))


def test_merge_keys_and_anchors_still_load(tmp_path):
    text = EXAMPLE.read_text()
    assert "  - name: orders\n" in text and "  - name: clicks\n" in text
    text = text.replace("  - name: orders\n", "  - <<: &tuned {max_message_bytes: 5000}\n    name: orders\n", 1)
    text = text.replace("  - name: clicks\n", "  - <<: [*tuned, {max_retries: 9}]\n    name: clicks\n", 1)
    path = tmp_path / "merge.yaml"
    path.write_text(text)
    cfg = load_config(path)
    assert cfg.pipeline("orders").max_message_bytes == 5000
    assert (cfg.pipeline("clicks").max_message_bytes, cfg.pipeline("clicks").max_retries) == (5000, 9)


def test_a_config_that_cannot_be_read_is_a_config_error_naming_it(tmp_path):
    (tmp_path / "binary.yaml").write_bytes(b"pipelines: \xff\xfe")
    for path, reason in ((tmp_path / "binary.yaml", "UnicodeDecodeError"), (tmp_path, "IsADirectoryError")):
        with pytest.raises(ConfigError, match=f"^{path}: cannot read the config file: {reason}"):
            load_config(path)


@pytest.mark.parametrize("url", ["redis://host:6379/0", "rediss://user@host:6380", "valkey://[::1]:6379/0",
                                 "valkey://h:6379/0?client_name=svc@x", "valkey://localhost"])
def test_urls_without_a_password_are_accepted(url):
    data = example()
    data["pipelines"][0]["source"]["url"] = url
    assert parse_config(data, Path("x.yaml")).pipeline("orders").source.url == url


def test_kafka_reads_committed_records_unless_told_otherwise():
    from deltadrain.sources.kafka.client import kafka_client_conf, kafka_consumer_conf, kafka_spark_options

    data = example()
    data["pipelines"][1]["source"].pop("isolation_level", None)
    cfg = parse_config(data, Path("x.yaml"))
    clicks = cfg.pipeline("clicks")
    assert clicks.source.isolation_level == "read_committed"
    # Spark's reader and the clients that read end offsets agree; producers and admin get no consumer setting.
    assert kafka_spark_options(cfg, clicks)["kafka.isolation.level"] == "read_committed"
    assert kafka_consumer_conf(cfg, clicks)["isolation.level"] == "read_committed"
    assert "isolation.level" not in kafka_client_conf(cfg, clicks)
    data["pipelines"][1]["source"]["isolation_level"] = "read_uncommitted"
    uncommitted = parse_config(data, Path("x.yaml")).pipeline("clicks")
    assert kafka_spark_options(cfg, uncommitted)["kafka.isolation.level"] == "read_uncommitted"
    data["pipelines"][1]["source"]["isolation_level"] = "committed"
    msg = error_of(data)
    assert "pipeline 'clicks'" in msg and "field 'source.isolation_level'" in msg


def test_a_gap_stops_either_source_unless_told_otherwise():
    data = example()
    for pipe in data["pipelines"]:
        pipe["source"].pop("on_gap", None)
    cfg = parse_config(data, Path("x.yaml"))
    assert [p.source.on_gap for p in cfg.pipelines] == ["fail", "fail"]
    accepting = [p.accepting_gaps() for p in cfg.pipelines]  # a run an operator started to go past a gap
    assert [p.source.on_gap for p in accepting] == ["continue", "continue"]
    assert [p.source.kind for p in accepting] == ["valkey", "kafka"] and accepting[0].batch_cap == cfg.pipelines[0].batch_cap
    assert cfg.pipelines[0].source.on_gap == "fail"
    data["pipelines"][0]["source"]["on_gap"] = "continue"
    assert parse_config(data, Path("x.yaml")).pipeline("orders").source.on_gap == "continue"
    data["pipelines"][0]["source"]["on_gap"] = "skip"
    msg = error_of(data)
    assert "pipeline 'orders'" in msg and "field 'source.on_gap'" in msg


def test_maintenance_has_safe_defaults_and_a_negative_retention_names_the_field():
    cfg = parse_config(example(), Path("x.yaml"))
    m = cfg.maintenance
    assert (m.schedule, m.optimize, m.vacuum, m.retain.days) == ("@daily", True, True, 7)
    data = example()
    data["maintenance"] = {"retain": "-PT1H"}
    msg = error_of(data, "conf/pipes.yaml")
    assert "conf/pipes.yaml" in msg and "field 'maintenance.retain'" in msg and "must not be negative" in msg
    data["maintenance"] = {"retian": "P1D"}
    assert "field 'maintenance.retian'" in error_of(data)


@pytest.mark.parametrize(("where", "value", "says"), [
    (("airflow", "poll_interval"), "-PT10S", "must be a positive duration"),
    (("airflow", "poll_interval"), "PT0S", "must be a positive duration"),  # a probe in a tight loop
    (("airflow", "wait_timeout"), "PT0S", "must be a positive duration"),
    (("airflow", "retry_delay"), "-PT1S", "must not be negative"),
    (("dedup_window",), "-P7D", "must not be negative"),  # the MERGE would look past the batch
    (("schedule",), "every 5 minutes", "is not a cron expression"),
])
def test_bad_durations_and_schedules_name_pipeline_and_field_at_load(where, value, says):
    # Before: a broken DAG file (every deltadrain DAG gone), a sensor polling without pause, or
    # redelivered messages inserted again, none of them naming the field.
    data = example()
    node = data["pipelines"][0]
    for key in where[:-1]:
        node = node.setdefault(key, {})
    node[where[-1]] = value
    msg = error_of(data, "conf/pipes.yaml")
    assert f"conf/pipes.yaml: pipeline 'orders', field '{'.'.join(where)}'" in msg and says in msg


def test_schedules_take_cron_and_airflows_presets():
    data = example()
    data["pipelines"][0]["schedule"] = "@hourly"
    data["pipelines"][1]["schedule"] = "0 */2 * * 1-5"
    data["maintenance"]["schedule"] = "@weekly"
    cfg = parse_config(data, Path("x.yaml"))
    assert [p.schedule for p in cfg.pipelines] == ["@hourly", "0 */2 * * 1-5"] and cfg.maintenance.schedule == "@weekly"
    data["maintenance"]["schedule"] = "daily"
    assert "field 'maintenance.schedule': 'daily' is not a cron expression" in error_of(data)


def test_an_ingest_schedule_may_be_continuous_and_its_dag_then_runs_back_to_back():
    from airflow.sdk.definitions.timetables.simple import ContinuousTimetable

    from deltadrain.names import batch_quality_dag_id, ingest_dag_id
    from deltadrain.orchestration.factory import build_dags

    data = example()
    data["pipelines"][0]["schedule"] = "@continuous"
    cfg = parse_config(data, Path("x.yaml"))
    name = cfg.pipelines[0].name
    dags = build_dags(cfg)
    dag = dags[ingest_dag_id(name)]
    assert isinstance(dag.timetable, ContinuousTimetable) and dag.max_active_runs == 1
    # Its batches are checked by a DAG of their own, started by the drain's asset event, so that the
    # next run does not wait for the check; that check holds no pool slot, the drains keep it.
    assert dag.task_dict["drain"].downstream_task_ids == set() and "quality" not in dag.task_ids
    checks = dags[batch_quality_dag_id(name)]
    # The target's Asset, the drain's first outlet (the dead letters' is the other).
    assert [a.uri for a in checks.timetable.asset_condition.objects] == \
        [o.uri for o in dag.task_dict["drain"].outlets][:1]
    (check,) = checks.tasks
    assert check.owed and check.pool == "default_pool" and checks.max_active_runs == 1
    # A quarantine writes to the target: its check stays in the ingest run, in the pipeline's pool.
    data["pipelines"][0]["quality"] = {"on_failure": "quarantine"}
    dags = build_dags(parse_config(data, Path("x.yaml")))
    assert batch_quality_dag_id(name) not in dags
    assert dags[ingest_dag_id(name)].task_dict["drain"].downstream_task_ids == {"quality"}
    # A cron schedule: the check after the drain in the same run, as before.
    assert batch_quality_dag_id(cfg.pipelines[1].name) not in build_dags(cfg)
    data["maintenance"]["schedule"] = "@continuous"  # the other DAGs run on a clock
    assert "field 'maintenance.schedule': '@continuous' is not a cron expression" in error_of(data)


def test_field_names_that_would_break_the_tables_sql_or_shadow_deltadrains_columns_are_refused():
    for bad in ("a`b", "_dd_batch", " "):
        data = example()
        data["pipelines"][0]["schema"]["fields"][bad] = "string"
        msg = error_of(data, "conf/pipes.yaml")
        assert "pipeline 'orders', field 'schema.fields'" in msg and repr(bad) in msg


def test_a_layout_column_must_exist_unless_a_transform_may_add_it():
    data = example()
    data["pipelines"][0]["target"]["partition_by"] = ["event_day"]
    data["pipelines"][0].pop("transform")
    msg = error_of(data, "conf/pipes.yaml")
    assert "pipeline 'orders'" in msg and "target.partition_by names ['event_day']" in msg
    data["pipelines"][0]["target"]["partition_by"] = ["status", "_dd_partition"]
    assert parse_config(data, Path("x.yaml")).pipelines[0].target.partition_by == ["status", "_dd_partition"]
    data["pipelines"][0]["transform"] = "deltadrain.transforms.sample_orders"
    data["pipelines"][0]["target"]["cluster_by"] = ["event_day"]  # the transform may add it
    assert parse_config(data, Path("x.yaml")).pipelines[0].target.cluster_by == ["event_day"]


def test_a_transform_that_fails_to_import_is_a_config_error_saying_where(tmp_path, monkeypatch):
    from deltadrain.transforms import load_transform

    (tmp_path / "broken_handlers.py").write_text("def handle(df):\n    return df\nraise RuntimeError('no token')\n")
    (tmp_path / "typo_handlers.py").write_text("def handle(df)\n    return df\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    where = "conf/pipes.yaml: pipeline 'orders', field 'transform': "
    with pytest.raises(ConfigError) as failed:
        load_transform("broken_handlers.handle", where)
    assert str(failed.value) == where + "transform 'broken_handlers.handle' cannot be imported: RuntimeError: no token"
    with pytest.raises(ConfigError, match=r"^conf/pipes.yaml: .*'typo_handlers.handle' cannot be imported: SyntaxError"):
        load_transform("typo_handlers.handle", where)
    with pytest.raises(ConfigError, match="'deltadrain.transforms.nope' cannot be imported: module .* has no attribute"):
        load_transform("deltadrain.transforms.nope")


def test_a_repeated_pipeline_name_names_both_entries():
    data = example()
    data["pipelines"][1]["name"] = "orders"
    data["pipelines"][1]["target"]["path"] = "other"
    msg = error_of(data)
    assert "pipeline names must be unique; repeated: ['orders'] (pipelines[0].name, pipelines[1].name)" in msg


def test_a_taken_port_names_the_setting_that_moves_it(tmp_path):
    from deltadrain.dev.services.process import Service

    kafka = Service("kafka", tmp_path, [9092, 9093, 9094], list, bool)
    assert kafka.port_setting(9092) == "services.kafka_port in the config or DELTADRAIN_KAFKA_PORT"
    assert kafka.port_setting(9093) == ("services.kafka_controller_port in the config or "
                                        "DELTADRAIN_KAFKA_CONTROLLER_PORT")
    assert kafka.port_setting(9094).endswith("DELTADRAIN_KAFKA_SASL_PORT")
    assert Service("valkey", tmp_path, [6379], list, bool).port_setting(6379).endswith("DELTADRAIN_VALKEY_PORT")


def _valkey_source(data: dict) -> dict:
    return next(p for p in data["pipelines"] if p["source"]["kind"] == "valkey")["source"]


@pytest.mark.parametrize(("key", "tag"), [("orders", "orders"), ("orders:{eu}", "eu"), ("{eu}:orders:{us}", "eu"),
                                          ("orders:{}x", "orders:{}x"), ("orders:{eu", "orders:{eu"),
                                          ("a}b{c}", "c")])
def test_hash_tag_follows_valkey_cluster_rules(key, tag):
    from deltadrain.config import hash_tag

    assert hash_tag(key) == tag


def test_a_cluster_source_takes_seed_urls_and_refuses_streams_that_share_a_hash_tag():
    data = example()
    source = _valkey_source(data)
    source.update(cluster=True, url=["valkey://10.0.0.1:7000", "valkey://10.0.0.2:7000"],
                  streams=["orders:{0}", "orders:{1}", "refunds"])
    cfg = parse_config(data, Path("pipes.yaml"))
    assert next(p for p in cfg.pipelines if p.source.kind == "valkey").source.seed_urls()[1] == "valkey://10.0.0.2:7000"
    source["streams"] = ["orders:{eu}", "refunds:{eu}", "other"]
    msg = error_of(data)
    assert "pipes.yaml" in msg and "field 'source'" in msg and "orders:{eu}, refunds:{eu} share the hash tag {eu}" in msg
    source.update(cluster=False, streams=["orders:{eu}", "refunds:{eu}"])
    assert "set cluster: true" in error_of(data)  # several seeds without cluster: true
    source["url"] = ["valkey://10.0.0.1:7000", "valkey://u:hunter2@10.0.0.2:7000"]
    source["cluster"] = True
    assert "carries a password" in error_of(data) and "hunter2" not in error_of(data)


OLD_SPELLING = """
pipelines:
  - name: clicks
    source: {kind: kafka, topic: clicks}
    target: {path: clicks}
    schema:
      format: avro
      avro_schema_file: schemas/clicks.avsc
      avro_wire: confluent
      avro_schema_id: 4
      registry_url: https://reg.example/apis/ccompat/v7
      registry_username_env: REG_USER
      registry_password_env: REG_PASSWORD
      id_field: event_id
      fields: {event_id: string, customer: string}
  - name: orders
    source: {kind: valkey, streams: [orders]}
    target: {path: orders}
    schema:
      format: protobuf
      protobuf_descriptor_file: schemas/clicks.desc
      protobuf_message: dev.deltadrain.sample.Click
      avro_wire: confluent
      avro_schema_id: 2
      id_field: event_id
      fields: {event_id: string}
"""


def test_the_old_flat_schema_keys_still_load_each_with_one_deprecation_line(tmp_path, caplog):
    """Configs written before the format blocks: each flat key lands in its block (the framing keys of a
    Protobuf schema in `protobuf:`), and the log says once per key how to write it now."""
    (tmp_path / "schemas").mkdir()
    for name in ("clicks.avsc", "clicks.desc"):
        (tmp_path / "schemas" / name).write_bytes((ROOT / "config" / "schemas" / name).read_bytes())
    path = tmp_path / "old.yaml"
    path.write_text(OLD_SPELLING)
    with caplog.at_level("WARNING", logger="deltadrain.config"):
        cfg = load_config(path)
    clicks, orders = cfg.pipeline("clicks").payload_schema, cfg.pipeline("orders").payload_schema
    assert (clicks.avro.schema_file, clicks.avro.wire, clicks.avro.schema_id) == (
        str(tmp_path / "schemas" / "clicks.avsc"), "confluent", 4)
    assert (clicks.registry.url, clicks.registry.username_env, clicks.registry.password_env) == (
        "https://reg.example/apis/ccompat/v7", "REG_USER", "REG_PASSWORD")
    assert (orders.protobuf.descriptor_file, orders.protobuf.message, orders.protobuf.wire, orders.protobuf.schema_id) \
        == (str(tmp_path / "schemas" / "clicks.desc"), "dev.deltadrain.sample.Click", "confluent", 2)
    assert orders.avro is None and orders.registry is None
    lines = [r.getMessage() for r in caplog.records if r.name == "deltadrain.config"]
    assert f"{path}: pipeline 'clicks', field 'schema.avro_wire' is deprecated: write 'schema.avro.wire'" in lines
    assert f"{path}: pipeline 'orders', field 'schema.avro_wire' is deprecated: write 'schema.protobuf.wire'" in lines
    assert f"{path}: pipeline 'clicks', field 'schema.registry_password_env' is deprecated: write " \
           "'schema.registry.password_env'" in lines
    assert len(lines) == 6 + 4 and len(set(lines)) == len(lines)
    # A key given in both spellings is an error naming both, not a silent choice.
    path.write_text(OLD_SPELLING.replace("      avro_wire: confluent\n      avro_schema_id: 4\n",
                                         "      avro_wire: confluent\n      avro: {wire: plain}\n", 1))
    with pytest.raises(ConfigError, match=f"{path}: pipeline 'clicks', field 'schema.avro_wire' is also given as "
                                          "'schema.avro.wire': keep 'schema.avro.wire' alone"):
        load_config(path)


def test_every_path_field_is_read_relative_to_the_config_file(tmp_path):
    """One rule for every path the config names (schema files, descriptor sets, CA files, data_dir): a
    relative one is joined to the config file's directory when the config is loaded."""
    conf = tmp_path / "conf"
    (conf / "schemas").mkdir(parents=True)
    (conf / "schemas" / "clicks.avsc").write_bytes((ROOT / "config" / "schemas" / "clicks.avsc").read_bytes())
    data = example()
    data["data_dir"] = "lake"
    data["pipelines"][0]["source"].update(url="valkeys://h:6380/0", tls_ca_file="certs/valkey.pem")
    data["pipelines"][1]["source"]["security"] = {"protocol": "SSL", "ssl_ca_location": "~/kafka.pem"}
    data["pipelines"][1]["schema"].update(format="avro", avro={"schema_file": "schemas/clicks.avsc"})
    data["pipelines"][1]["schema"]["fields"] = {"event_id": "string", "customer": "string"}
    data["pipelines"][1]["schema"]["required"] = ["event_id"]
    path = conf / "p.yaml"
    path.write_text(yaml.safe_dump(data))
    cfg = load_config(path)
    orders, clicks = cfg.pipeline("orders"), cfg.pipeline("clicks")
    assert cfg.data_dir == str(conf / "lake") and cfg.lake_dir() == conf / "lake"
    assert orders.source.tls_ca_file == str(conf / "certs" / "valkey.pem")
    assert clicks.source.security.ssl_ca_location == str(Path("~/kafka.pem").expanduser())
    assert clicks.payload_schema.avro.schema_file == str(conf / "schemas" / "clicks.avsc")
    # Absolute paths and object store URLs stay as they are.
    data["data_dir"] = "s3a://lake/x"
    data["pipelines"][0]["source"]["tls_ca_file"] = "/etc/valkey.pem"
    path.write_text(yaml.safe_dump(data))
    cfg = load_config(path)
    assert cfg.data_dir == "s3a://lake/x" and cfg.pipeline("orders").source.tls_ca_file == "/etc/valkey.pem"

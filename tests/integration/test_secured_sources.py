"""Draining from servers that demand a login: the embedded Valkey's ACL user, a wrong password and a
user whose ACL lacks a command a drain needs, each a one-line error with nothing claimed, committed
or acknowledged, and the next correct run draining everything once."""

from __future__ import annotations

import json
import stat
import uuid
from pathlib import Path

import pytest

from deltadrain.catchup import drain
from deltadrain.config.embedded import VALKEY_CONNECTION_ID, ports, valkey_login_file
from deltadrain.dev.produce import produce
from deltadrain.lake.delta import is_table
from deltadrain.sources.connections import unreachable
from deltadrain.sources.valkey.acl import acl_rule
from deltadrain.sources.valkey.client import valkey_client
from tests.support.pipelines import set_source
from tests.support.valkey import (
    assert_exactly_once,
    drain_until_done,
    lag,
    make_pipeline,
    pending,
    valkey_admin,
)

pytestmark = pytest.mark.usefixtures("valkey_server")


def _refused(c, p, spark) -> tuple[str, str]:
    """A drain that must fail on the source's login or ACL: (kind, the one-line error the CLI prints)."""
    with pytest.raises(Exception) as raised:
        drain(c, p, spark=spark)
    found = unreachable(raised.value, c, [p])
    assert found is not None, f"not named as a login or ACL failure: {raised.value!r}"
    assert "\n" not in found[1]
    return found


def _nothing_taken(spark, c, p, client, produced: int) -> None:
    assert not is_table(spark, str(c.target_path(p))), "committed"
    assert pending(client, p) == 0 and lag(client, p) == produced, "claimed or acknowledged"


def test_valkey_acl_user_wrong_password_and_missing_permission(tmp_path, spark, monkeypatch, caplog):
    import valkey

    path, c, p = make_pipeline(tmp_path, partitions=2)
    assert p.source.connection_id == VALKEY_CONNECTION_ID  # the example config's login, as every test's
    # The logins are owner-only; the server knows no default user, and the drains' user no admin command.
    assert stat.S_IMODE(valkey_login_file().stat().st_mode) == 0o600
    assert stat.S_IMODE((valkey_login_file().parent / "users.acl").stat().st_mode) == 0o600
    with pytest.raises(valkey.AuthenticationError):
        valkey.Valkey(host="127.0.0.1", port=ports(c).valkey).ping()
    client = valkey_client(c, p)
    for denied in (("CONFIG", "GET", "dir"), ("FLUSHALL",), ("KEYS", "*"), ("ACL", "LIST")):
        with pytest.raises(valkey.exceptions.NoPermissionError):
            client.execute_command(*denied)
    result = produce(c, p, 200, seed=47)

    # A wrong password in the connection: refused, named, nothing taken.
    secret = f"wrong-{uuid.uuid4().hex}"
    with monkeypatch.context() as env:
        env.setenv(f"AIRFLOW_CONN_{VALKEY_CONNECTION_ID.upper()}", json.dumps({"login": "deltadrain",
                                                                               "password": secret}))
        kind, line = _refused(c, p, spark)
    assert kind == "login_refused" and f"refused the login of pipeline '{p.name}'" in line
    assert "password_env/connection_id" in line and secret not in line
    _nothing_taken(spark, c, p, client, 200)

    # A user of its own whose ACL lacks XACK (which a run needs only after its commit): the run stops
    # before it claims anything, naming the command.
    user, pw = f"lim_{p.name}", uuid.uuid4().hex
    valkey_admin().execute_command("ACL", "SETUSER", user, "on", f">{pw}", *acl_rule().split(), "-xack")
    try:
        conn_id = f"lim_{p.name}"
        monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({"login": user, "password": pw}))
        c2, p2 = set_source(path, connection_id=conn_id)
        kind, line = _refused(c2, p2, spark)
        assert kind == "denied" and "'xack'" in line and user in line and "docs/config.md" in line, line
        assert pw not in line
        _nothing_taken(spark, c, p, client, 200)
    finally:
        valkey_admin().execute_command("ACL", "DELUSER", user)

    # The next correct run drains everything once.
    c, p = set_source(path, connection_id=VALKEY_CONNECTION_ID)
    caplog.set_level("DEBUG")
    drain_until_done(c, p, spark, client)
    assert_exactly_once(spark, c, p, client, result.valid_ids, 0)
    # The password is in no log line and no commit of the target's.
    password = json.loads(valkey_login_file().read_text())["password"]
    assert caplog.text and password not in caplog.text
    commits = "".join(f.read_text() for f in (Path(c.target_path(p)) / "_delta_log").glob("*.json"))
    assert '"userMetadata"' in commits and password not in commits


def _other_ca(tmp_path) -> str:
    """A CA of the test's own, which did not sign the broker's certificate (PEM)."""
    import os
    import subprocess

    from deltadrain.runtime.session import check_java

    keytool = str(Path(check_java()).parent / "keytool")
    env = {**os.environ, "PW": uuid.uuid4().hex}
    store = ("-keystore", str(tmp_path / "other.p12"), "-storetype", "PKCS12", "-storepass:env", "PW")
    subprocess.run([keytool, "-genkeypair", "-alias", "ca", "-keyalg", "RSA", "-dname", "CN=not the broker's CA",
                    "-ext", "bc:c", *store], env=env, check=True, capture_output=True)
    subprocess.run([keytool, "-exportcert", "-rfc", "-alias", "ca", "-file", str(tmp_path / "other.pem"), *store],
                   env=env, check=True, capture_output=True)
    return str(tmp_path / "other.pem")


@pytest.mark.usefixtures("valkey_tls_server")
def test_valkey_over_tls_drains_once_and_names_an_untrusted_ca(tmp_path, spark):
    import valkey

    from deltadrain.config.embedded import valkey_tls_home
    from deltadrain.sources.valkey.client import valkey_url

    path, c, p = make_pipeline(tmp_path, partitions=2, source={"tls": True})
    assert valkey_url(c, p.source) == f"valkeys://127.0.0.1:{ports(c).valkey_tls}/0"
    # The port speaks TLS only, and its keys are owner-only.
    with pytest.raises(valkey.ConnectionError):
        valkey.Valkey(host="127.0.0.1", port=ports(c).valkey_tls, socket_timeout=3).ping()
    for key in ("ca.key", "server.key"):
        assert stat.S_IMODE((valkey_tls_home() / key).stat().st_mode) == 0o600, key
    client = valkey_client(c, p)
    result = produce(c, p, 150, seed=49)  # over TLS too

    # A CA that did not sign the server's certificate: named, nothing claimed, committed or acknowledged.
    c2, p2 = set_source(path, tls_ca_file=_other_ca(tmp_path))
    kind, line = _refused(c2, p2, spark)
    assert kind == "untrusted" and "CERTIFICATE_VERIFY_FAILED" in line and "source.tls_ca_file" in line, line
    _nothing_taken(spark, c, p, client, 150)

    # With the embedded CA (tls_ca_file unset) the next runs drain everything once, over TLS.
    c, p = set_source(path, tls_ca_file=None)
    drain_until_done(c, p, spark, client)
    assert_exactly_once(spark, c, p, client, result.valid_ids, 0)


def _kafka_pipeline(tmp_path, security: dict):
    """The example's Kafka pipeline on a topic of its own, over `security`."""
    import yaml

    from tests.support.pipelines import ROOT, write_config

    data = yaml.safe_load((ROOT / "config" / "pipelines.yaml").read_text())
    name = f"s_{uuid.uuid4().hex[:8]}"
    pipe = next(p for p in data["pipelines"] if p["source"]["kind"] == "kafka")
    pipe.update(name=name, target={"path": name})
    pipe["source"].update(topic=name, partitions=2, group=f"{name}-group", security=security)
    pipe.pop("quality", None)
    return write_config(tmp_path, data, pipe)  # `produce` makes the topic as the broker's admin


def _kafka_admin(c):
    """The embedded broker's admin: its PLAINTEXT listener, whose principal is a super user."""
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": f"127.0.0.1:{ports(c).kafka}"})


def _scram_user(admin, user: str, password: str) -> None:
    from confluent_kafka.admin import ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion

    info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192)
    for f in admin.alter_user_scram_credentials([UserScramCredentialUpsertion(user, info, password.encode())]).values():
        f.result()


def _grant(admin, user: str, kind: str, name: str) -> None:
    """READ for `user` on the topic or group `name`, as `kafka-acls.sh --add ... --operation Read` does."""
    from confluent_kafka.admin import (
        AclBinding,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    binding = AclBinding(ResourceType[kind], name, ResourcePatternType.LITERAL, f"User:{user}", "*",
                         AclOperation.READ, AclPermissionType.ALLOW)
    for f in admin.create_acls([binding]).values():
        f.result()


def _drop_user(admin, user: str) -> None:
    from confluent_kafka.admin import (
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
        ScramMechanism,
        UserScramCredentialDeletion,
    )

    acls = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, f"User:{user}", None,
                            AclOperation.ANY, AclPermissionType.ANY)
    for f in admin.delete_acls([acls]).values():
        f.result()
    for f in admin.alter_user_scram_credentials([UserScramCredentialDeletion(user, ScramMechanism.SCRAM_SHA_512)]
                                                ).values():
        f.result()


def _ends(conf: dict, topic: str) -> dict[int, int]:
    from deltadrain.sources.kafka.offsets import watermarks

    return {q: high for q, (_, high) in watermarks(conf, topic).items()}


@pytest.mark.usefixtures("kafka_broker")
def test_kafka_sasl_ssl_drain_wrong_password_untrusted_ca_and_missing_group_acl(tmp_path, spark, monkeypatch):
    from deltadrain.config.embedded import KAFKA_CONNECTION_ID, kafka_login, ports
    from deltadrain.sources.kafka.client import kafka_client_conf, kafka_spark_options
    from deltadrain.sources.kafka.offsets import group_offsets
    from tests.support.lake import target_ids

    security = {"protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512", "connection_id": KAFKA_CONNECTION_ID}
    path, c, p = _kafka_pipeline(tmp_path, security)
    conf = kafka_client_conf(c, p)
    assert conf["bootstrap.servers"] == f"127.0.0.1:{ports(c).kafka_sasl}" and conf["ssl.ca.location"].endswith("ca.pem")
    assert kafka_spark_options(c, p)["kafka.security.protocol"] == "SASL_SSL"
    result = produce(c, p, 150, seed=48)  # over SASL_SSL too
    var = f"AIRFLOW_CONN_{KAFKA_CONNECTION_ID.upper()}"

    # A wrong password: refused and named, nothing read, committed or recorded in the group.
    secret = f"wrong-{uuid.uuid4().hex}"
    with monkeypatch.context() as env:
        env.setenv(var, json.dumps({"login": kafka_login()["username"], "password": secret}))
        kind, line = _refused(c, p, spark)
    assert kind == "login_refused" and f"refused the login of pipeline '{p.name}'" in line and secret not in line

    # A CA that did not sign the broker's certificate.
    c2, p2 = set_source(path, security={**security, "ssl_ca_location": _other_ca(tmp_path)})
    kind, line = _refused(c2, p2, spark)
    assert kind == "untrusted" and "certificate verify failed" in line and "ssl_ca_location" in line, line
    assert not is_table(spark, str(c.target_path(p))), "committed"
    offsets = group_offsets(conf, p.source.group, p.source.topic, [0, 1])
    assert all(o is None or o < 0 for o in offsets.values()), f"offsets committed: {offsets}"

    # A user with READ on the topic but no ACL on the group: denied before it reads, naming the ACL.
    # Once that ACL is added, the same user drains everything once: topic READ and group READ are all
    # a drain needs (the broker's authorizer is on; ANONYMOUS, the PLAINTEXT admin, is its super user).
    user, pw = f"lim_{p.name}", uuid.uuid4().hex
    admin = _kafka_admin(c)
    _scram_user(admin, user, pw)
    try:
        _grant(admin, user, "TOPIC", p.source.topic)
        monkeypatch.setenv(f"AIRFLOW_CONN_{user.upper()}", json.dumps({"login": user, "password": pw}))
        c, p = set_source(path, security={**security, "connection_id": user})
        kind, line = _refused(c, p, spark)
        assert kind == "denied" and "GROUP_AUTHORIZATION_FAILED" in line and pw not in line, line
        assert f"--allow-principal User:{user} --operation Read --group {p.source.group}" in line, line
        assert not is_table(spark, str(c.target_path(p))), "committed"
        offsets = group_offsets(conf, p.source.group, p.source.topic, [0, 1])
        assert all(o is None or o < 0 for o in offsets.values()), f"offsets committed: {offsets}"
        _grant(admin, user, "GROUP", p.source.group)
        while drain(c, p, spark=spark).claimed:
            pass
    finally:
        _drop_user(admin, user)
    assert group_offsets(conf, p.source.group, p.source.topic, [0, 1]) == _ends(conf, p.source.topic)
    ids = target_ids(spark, c, p)
    assert len(ids) == len(set(ids)) and set(ids) == set(result.valid_ids)
    log = Path(c.target_path(p)) / "_delta_log"
    assert kafka_login()["password"] not in "".join(f.read_text() for f in log.glob("*.json"))


@pytest.mark.usefixtures("kafka_broker", "spark_connect_server", "s3_server", "valkey_tls_server")
def test_the_embedded_services_listen_on_the_loopback_only(cfg):
    from deltadrain.dev import services
    from tests.support.processes import beyond_loopback, listening_addresses

    seen = {}
    for name in ("valkey", "valkey_tls", "kafka", "spark_connect", "s3"):
        pid = services.FACTORIES[name](cfg).pid()
        assert pid is not None, f"{name} is not running"
        addresses = listening_addresses(pid)
        assert addresses, f"{name} (pid {pid}) listens nowhere"
        seen[name] = addresses
    beyond = {n: beyond_loopback(addrs) for n, addrs in seen.items()}
    assert not any(beyond.values()), f"listening beyond 127.0.0.1: {beyond}"
    # Each service's own ports among them (one listener per port it owns, at least).
    for name in seen:
        ports_seen = {int(a.split(":")[1], 16) for a in seen[name]}
        assert set(services.FACTORIES[name](cfg).ports) <= ports_seen, (name, ports_seen)

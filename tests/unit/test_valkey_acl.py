"""The Valkey ACL a drain needs: the rule the embedded server's user gets, and the list docs/config.md
gives users for their own server, are the same commands."""

import re
from pathlib import Path

from deltadrain.sources.valkey.acl import DRAIN_COMMANDS, acl_rule

DOC = Path(__file__).resolve().parents[2] / "docs" / "config.md"


def test_the_rule_denies_everything_but_the_drains_commands():
    words = acl_rule("orders:*").split()
    assert words[:3] == ["~orders:*", "resetchannels", "-@all"]
    assert words[3:] == [f"+{c}" for c in DRAIN_COMMANDS]
    assert not {"+@all", "+config", "+flushall", "+keys", "+acl", "+xtrim", "+xdel"} & set(words)


def test_config_doc_lists_exactly_the_commands_of_the_rule():
    block = DOC.read_text().split("#### Valkey ACL", 1)[1].split("```", 2)[1]
    assert re.findall(r"\+([a-z|]+)", block) == list(DRAIN_COMMANDS)


def _valkey_source(**fields):
    from deltadrain.config import ValkeySource

    return ValkeySource(kind="valkey", streams=["s"], **fields)


def test_tls_settings_name_a_tls_url_and_a_ca_only_over_tls():
    import pytest
    from pydantic import ValidationError

    from deltadrain.config import load_config
    from deltadrain.config.embedded import ports, valkey_ca_file
    from deltadrain.sources.valkey.client import seed_urls, tls_ca

    cfg = load_config()
    embedded = _valkey_source(tls=True)
    assert embedded.uses_tls() and seed_urls(cfg, embedded) == [f"valkeys://127.0.0.1:{ports(cfg).valkey_tls}/0"]
    assert tls_ca(embedded) == str(valkey_ca_file())  # the embedded port's own CA
    assert tls_ca(_valkey_source(tls=True, tls_ca_file="/ca.pem")) == "/ca.pem"
    theirs = _valkey_source(url="rediss://h:6380/0")
    assert theirs.uses_tls() and tls_ca(theirs) is None  # the system's CAs
    assert not _valkey_source().uses_tls() and tls_ca(_valkey_source()) is None
    for bad, said in (({"tls": True, "url": "valkey://h:6379"}, "tls: true needs valkeys://"),
                      ({"tls_ca_file": "/ca.pem"}, "tls_ca_file is set but the connection is plain"),
                      ({"tls_ca_file": "/ca.pem", "url": "redis://h"}, "tls_ca_file is set"),
                      ({"tls": True, "cluster": True}, "embedded Valkey Cluster has no TLS port")):
        with pytest.raises(ValidationError, match=said):
            _valkey_source(**bad)


def test_a_failed_certificate_check_is_untrusted_and_names_the_ca_setting():
    import valkey

    from deltadrain.config import load_config
    from deltadrain.sources.connections import unreachable
    from deltadrain.sources.valkey.source import Valkey

    said = "Error 1 connecting to 127.0.0.1:6398. [SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed"
    assert Valkey().connection_failure(valkey.ConnectionError(said)) == ("untrusted", said)
    assert Valkey().connection_failure(valkey.ConnectionError("Connection refused"))[0] == "unreachable"
    cfg = load_config()
    pipeline = next(p for p in cfg.pipelines if p.source.kind == "valkey")
    kind, line = unreachable(valkey.ConnectionError(said), cfg, [pipeline])
    assert kind == "untrusted" and "source.tls_ca_file" in line and "\n" not in line


def test_the_tls_port_starts_only_when_named_or_used_and_needs_stunnel(monkeypatch, tmp_path):
    import pytest

    from deltadrain.config import load_config
    from deltadrain.dev import services
    from deltadrain.dev.services import valkey_tls
    from deltadrain.errors import PrerequisiteError

    cfg = load_config()
    assert "valkey_tls" not in services.defaults(cfg)
    valkey = next(p for p in cfg.pipelines if p.source.kind == "valkey")
    tls = valkey.model_copy(update={"source": valkey.source.model_copy(update={"tls": True})})
    assert services.defaults(cfg.model_copy(update={"pipelines": [tls]}))[:2] == ["valkey", "valkey_tls"]
    conf = valkey_tls.stunnel_conf(tmp_path, 6398, 6399)
    assert "accept = 127.0.0.1:6398" in conf and "connect = 127.0.0.1:6399" in conf and "\naccept = 6398" not in conf
    monkeypatch.setenv("PATH", str(tmp_path))  # no stunnel here
    with pytest.raises(PrerequisiteError, match="apt-get install -y stunnel4"):
        valkey_tls.stunnel_binary()


def test_a_kafka_denial_names_the_acl_to_add():
    from confluent_kafka import KafkaError, KafkaException

    from deltadrain.config import load_config
    from deltadrain.sources.connections import unreachable
    from deltadrain.sources.kafka.acl import DRAIN_ACLS, acl_to_add

    assert acl_to_add("GROUP_AUTHORIZATION_FAILED: no", "t", "g", "u") == (
        "kafka-acls.sh --add --allow-principal User:u --operation Read --group g")
    assert acl_to_add("TOPIC_AUTHORIZATION_FAILED: no", "t", "g", None) == (
        "kafka-acls.sh --add --allow-principal User:<the login> --operation Read --operation Describe "
        "--operation Write --topic t")
    assert acl_to_add("CLUSTER_AUTHORIZATION_FAILED: no", "t", "g", "u") is None
    # docs/config.md lists the same ACLs.
    doc = DOC.read_text().split("#### The embedded broker's ACLs", 1)[1].split("\n#", 1)[0]
    listed = re.findall(r"^\| (topic|group) \| `([A-Z]+)` \|", doc, re.M)
    assert listed == [(kind, op) for kind, op, _ in DRAIN_ACLS]

    cfg = load_config()
    kafka = next(p for p in cfg.pipelines if p.source.kind == "kafka")
    error = KafkaException(KafkaError(KafkaError.GROUP_AUTHORIZATION_FAILED, reason="Group authorization failed"))
    kind, line = unreachable(error, cfg, [kafka])
    assert kind == "denied" and f"--operation Read --group {kafka.source.group}" in line and "\n" not in line, line

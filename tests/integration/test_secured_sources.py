"""Draining from servers that demand a login: the embedded Valkey's ACL user, a wrong password and a
user whose ACL lacks a command a drain needs, each a one-line error with nothing claimed, committed
or acknowledged, and the next correct run draining everything once."""

from __future__ import annotations

import json
import stat
import uuid

import pytest

from deltadrain.catchup import drain
from deltadrain.connections import unreachable
from deltadrain.dev.produce import produce
from deltadrain.embedded import VALKEY_CONNECTION_ID, ports, valkey_login_file
from deltadrain.lake import is_table
from deltadrain.sources.valkey.acl import acl_rule
from deltadrain.sources.valkey.client import valkey_client
from tests.integration.helpers import (
    assert_exactly_once,
    drain_until_done,
    lag,
    make_pipeline,
    pending,
    set_source,
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


def test_valkey_acl_user_wrong_password_and_missing_permission(tmp_path, spark, monkeypatch):
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
    drain_until_done(c, p, spark, client)
    assert_exactly_once(spark, c, p, client, result.valid_ids, 0)

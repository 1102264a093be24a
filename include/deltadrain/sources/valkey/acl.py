"""The Valkey ACL a drain needs: the commands every Valkey step of deltadrain sends (drain, acknowledge,
reap, gaps, status, probe, replay and `produce`), and the rule that grants them. The embedded Valkey's
user has exactly this; docs/config.md lists it for users who write the same ACL on their server."""

from __future__ import annotations

# Grouped by what needs them; a subcommand is `command|subcommand`.
DRAIN_COMMANDS = (
    # the connection: valkey-py's handshake and health checks
    "auth", "hello", "ping", "client|setinfo", "client|setname", "select",
    # reading and holding entries (drain, reaper, gaps)
    "xreadgroup", "xautoclaim", "xclaim", "xack", "xpending", "xrange", "xrevrange", "xlen",
    "xinfo|stream", "xinfo|groups", "xinfo|consumers",
    "xgroup|create", "xgroup|setid", "xgroup|delconsumer", "xgroup|destroy", "exists",
    # replay and `deltadrain produce` append
    "xadd",
    # the gap and failure keys (hashes), the scripts that move claims and positions atomically
    "hset", "hget", "hmget", "hgetall", "hdel", "hincrby", "del", "eval", "evalsha", "multi", "exec",
)


def acl_rule(keys: str = "*") -> str:
    """The rule (after `ACL SETUSER <user> on >password`) for a drain's user: no channel, only
    DRAIN_COMMANDS, on keys matching `keys` (its streams and the `deltadrain:` keys of its pipelines)."""
    return " ".join([f"~{keys}", "resetchannels", "-@all", *(f"+{c}" for c in DRAIN_COMMANDS)])


def acl_probe_key(pipeline: str) -> str:
    """A key among the pipeline's own (`deltadrain:{<pipeline>}:`, which its ACL grants) that is never written."""
    return f"deltadrain:{{{pipeline}}}:acl-probe"


def check_after_commit(client, stream: str, group: str, probe_key: str, hashes: list[str]) -> None:
    """Try what the run needs after its commit (XACK, and XCLAIM, HGET and HDEL, which its scripts
    call to hand claims over and forget gaps) in forms that change nothing, before it claims anything:
    a user whose ACL lacks one fails here with NoPermissionError, with nothing claimed, committed or
    acknowledged, instead of after a commit it cannot acknowledge. No entry has the id 0-0 and no
    hash the field ""; XCLAIM goes to `probe_key`, a key that never exists (its NOGROUP answer comes
    after the ACL let it through): on a stream it would make a consumer."""
    from valkey.exceptions import NoPermissionError, ResponseError

    client.xack(stream, group, "0-0")
    try:
        client.xclaim(probe_key, group, "acl-probe", 0, ["0-0"], justid=True)
    except NoPermissionError:
        raise
    except ResponseError as exc:
        if "NOGROUP" not in str(exc):
            raise
    for key in hashes:
        client.hget(key, "")
        client.hdel(key, "")
    client.eval("return 0", 0)

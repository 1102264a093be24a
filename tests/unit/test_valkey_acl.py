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

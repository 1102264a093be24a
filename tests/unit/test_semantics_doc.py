"""docs/semantics.md names a test for every guarantee: each named test file and function must exist."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "semantics.md"
REF = re.compile(r"\b(tests/[\w/]+\.py)::(\w+)")


def references() -> list[tuple[str, str]]:
    return REF.findall(DOC.read_text())


def test_the_document_names_tests():
    refs = references()
    assert len(refs) >= 30, f"only {len(refs)} test references found in {DOC}"
    files = {f for f, _ in refs}
    assert {"tests/integration/test_valkey_drain.py", "tests/integration/test_view.py"} <= files


def test_every_named_test_exists():
    missing = []
    for file, name in sorted(set(references())):
        path = ROOT / file
        if not path.is_file():
            missing.append(f"{file} (no such file)")
        elif not re.search(rf"^(async )?def {re.escape(name)}\(", path.read_text(), re.MULTILINE):
            missing.append(f"{file}::{name}")
    assert not missing, "docs/semantics.md names tests that do not exist: " + ", ".join(missing)

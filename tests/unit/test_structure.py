"""The package's shape: every source answers the whole interface and every drain supplies its steps to
the one run order, the shared steps never ask which kind a source is, and no module imports another that
imports it back (docs/sources.md); the suite's test modules share code through tests/support, not each other."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

from deltadrain.sources import KINDS, NamesPartitions, Reaps, Source, SuggestsGrants, for_kind

PACKAGE = Path(__file__).resolve().parents[2] / "include" / "deltadrain"
TESTS = Path(__file__).resolve().parents[1]


def modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = ("deltadrain", *path.relative_to(PACKAGE).with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imports(path: Path, known: dict[str, Path]) -> set[str]:
    """The package's modules `path` imports, at the top or inside a function."""

    def resolve(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("deltadrain"):
            found |= {resolve(f"{node.module}.{a.name}") for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {resolve(a.name) for a in node.names if a.name.startswith("deltadrain")}
    return found - {None}


CAPABILITIES = [Reaps, NamesPartitions, SuggestsGrants]


def test_every_source_answers_the_whole_interface():
    """Each kind is a `Source` with nothing left abstract, whose methods take what the base's take; what
    only some kinds can do is a capability a kind has or lacks, never a method that says it has none."""
    required = set(Source.__abstractmethods__)
    assert {"drain", "read_interval", "send_back", "probe", "counts"} <= required
    assert not required & {n for cap in CAPABILITIES for n in cap.__abstractmethods__}
    for kind in KINDS:
        source = for_kind(kind)
        assert isinstance(source, Source) and source.kind == kind
        assert all(isinstance(getattr(source, name, None), str) for name in Source.__annotations__), kind
        has = [cap for cap in CAPABILITIES if isinstance(source, cap)]
        for base in [Source, *has]:
            for name in base.__abstractmethods__:
                wanted = list(inspect.signature(getattr(base, name)).parameters)
                assert list(inspect.signature(getattr(type(source), name)).parameters) == wanted, (kind, name)
        for cap in set(CAPABILITIES) - set(has):
            assert not [n for n in cap.__abstractmethods__ if hasattr(source, n)], (kind, cap.__name__)


def test_every_drain_supplies_the_steps_and_keeps_the_run_order():
    """Each kind's drain is a `Drain` with every step supplied, with the steps' parameters, and without a
    `run` of its own: the order (checkpoint, plan, claim, publish, then acknowledge or release) is
    Drain.run's alone."""
    import importlib

    from deltadrain.run.drain import Drain
    from deltadrain.run.steps import Leases, MirrorsCheckpoint, Notices, RecordsGaps

    for kind, module in KINDS.items():
        drains = [c for c in vars(importlib.import_module(module.rpartition(".")[0] + ".drain")).values()
                  if isinstance(c, type) and issubclass(c, Drain) and c is not Drain]
        assert len(drains) == 1, (kind, drains)
        drain = drains[0]
        assert not drain.__abstractmethods__ and drain.run is Drain.run, kind
        for base in [Drain, *(m for m in (Leases, MirrorsCheckpoint, Notices, RecordsGaps) if issubclass(drain, m))]:
            for name in base.__abstractmethods__:
                wanted = list(inspect.signature(getattr(base, name)).parameters)
                assert list(inspect.signature(getattr(drain, name)).parameters) == wanted, (kind, name)


def test_each_source_kind_has_a_config_model_and_a_package():
    """The `source:` models live with the config (deltadrain.config.sources), what each kind does in its
    package: a kind needs both."""
    from deltadrain.config import SOURCE_KINDS

    assert set(KINDS) == SOURCE_KINDS


# What choosing between kinds looks like: an isinstance on a source model, or a comparison with a kind.
KIND_BRANCH = re.compile(r"isinstance\([^)]*(Valkey|Kafka)Source|kind\s*[!=]=\s*[\"'](valkey|kafka)[\"']"
                         r"|[\"'](valkey|kafka)[\"']\s*[!=]=|\.source\.(streams|topic)\b")


@pytest.mark.parametrize("path", sorted(p for p in PACKAGE.rglob("*.py")
                                        if not {"sources", "dev"} & set(p.relative_to(PACKAGE).parts)),
                         ids=lambda p: str(p.relative_to(PACKAGE)))
def test_shared_modules_never_ask_which_kind_a_source_is(path):
    """Outside sources/ (and the development tools of dev/, which produce test data per kind)."""
    branches = [f"{n}: {line.strip()}" for n, line in enumerate(path.read_text().splitlines(), 1)
                if KIND_BRANCH.search(line)]
    assert not branches


def test_no_module_imports_one_that_imports_it_back():
    known = modules()
    graph = {name: imports(path, known) - {name} for name, path in known.items()}
    cycles = []

    def visit(name: str, trail: list[str]) -> None:
        for other in sorted(graph[name]):
            if other in trail:
                cycles.append(trail[trail.index(other):] + [other])
            elif other not in seen:
                seen.add(other)
                visit(other, [*trail, other])

    seen: set[str] = set()
    for start in sorted(graph):
        if start not in seen:
            seen.add(start)
            visit(start, [start])
    assert not cycles


# The package's layers, lowest first: a module imports from its own layer or the ones below, never
# from above (docs/sources.md, "The package"). Each entry is a package or a module at the root.
LAYERS = [
    {"errors", "paths", "names", "logs", "positions", "failpoints", "secrets", "transforms"},
    {"schema"},
    {"formats"},
    {"config"},
    {"lake"},
    {"runtime"},
    {"run"},
    {"sources"},
    {"quality", "heal", "observe"},
    {"catchup", "jobs", "airflow_api"},
    {"orchestration"},
    {"dev"},
    {"cli"},
]
MAX_ROOT_MODULES = 15
MAX_LINES = 600


def layer_of(module: str) -> int:
    top = module.split(".")[1] if "." in module else ""
    return next(i for i, names in enumerate(LAYERS) if top in names)


def test_every_root_module_and_package_has_a_layer():
    tops = {p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    tops |= {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert tops == set().union(*LAYERS)


def test_few_modules_at_the_root():
    root = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(root) <= MAX_ROOT_MODULES, root


def test_no_import_runs_up_a_layer():
    known = modules()
    upward = [f"{name} ({layer_of(name)}) imports {other} ({layer_of(other)})"
              for name, path in sorted(known.items()) if name != "deltadrain"
              for other in sorted(imports(path, known)) if other != "deltadrain"
              and layer_of(other) > layer_of(name)]
    assert not upward, "\n".join(upward)


def test_each_package_has_a_face():
    """A docstring that says what is inside, and `__all__` naming what it offers."""
    faceless = []
    for init in sorted(PACKAGE.rglob("__init__.py")):
        tree = ast.parse(init.read_text())
        names = {t.id for node in tree.body if isinstance(node, ast.Assign) for t in node.targets
                 if isinstance(t, ast.Name)}
        if ast.get_docstring(tree) is None or "__all__" not in names:
            faceless.append(str(init.relative_to(PACKAGE)))
    assert not faceless


def test_no_module_is_long():
    long = {str(p.relative_to(PACKAGE)): n for p in sorted(PACKAGE.rglob("*.py"))
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long


def test_only_orchestration_imports_airflow():
    """The layers below take what they need of Airflow as plain values (connections through
    deltadrain.secrets' store, which orchestration registers): they run in Spark drivers and the CLI too."""
    importing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if "orchestration" in path.relative_to(PACKAGE).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            importing += [f"{path.relative_to(PACKAGE)}: {n}" for n in names if n.split(".")[0] == "airflow"]
    assert not importing


# Assignments to a private attribute of an object that is not `self`, each with why it is there.
PRIVATE_ASSIGNMENTS = {
    ("run/layout.py", "effective._evolved"): "deltadrain's own schema model's private attribute",
    ("run/layout.py", "effective._adding"): "deltadrain's own schema model's private attribute",
    ("runtime/session.py", "client._closed"): "pyspark's Connect client: its close would hang the process "
                                              "(close_own_channel_only)",
}


def test_no_private_attribute_of_another_librarys_object_is_assigned():
    """Another library's private attributes change without notice (the Spark provider's hook is made from
    its public arguments, see orchestration/submit.py): `obj._name = ...` only on objects of our own."""
    assigned = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            targets = node.targets if isinstance(node, ast.Assign) else \
                [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
            for target in targets:
                while isinstance(target, ast.Subscript):
                    target = target.value
                if isinstance(target, ast.Attribute) and target.attr.startswith("_") and \
                        not target.attr.startswith("__") and \
                        not (isinstance(target.value, ast.Name) and target.value.id in {"self", "cls"}):
                    assigned.add((str(path.relative_to(PACKAGE)), ast.unparse(target)))
    assert not assigned - set(PRIVATE_ASSIGNMENTS)


def imported_test_modules(source: str) -> set[str]:
    """The test modules (a dotted part named test_*) that `source` imports from the suite, at the top or
    inside a function: `from tests.x.test_y import z`, `import tests.x.test_y`, `from tests.x import test_y`,
    and relative imports alike."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names if a.name.split(".")[0] == "tests"]
        elif isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").split(".")[0] == "tests"):
            base = "." * node.level + (node.module or "")
            names = [f"{base}.{a.name}" if node.module else base + a.name for a in node.names]
        else:
            continue
        found |= {n for n in names if any(part.startswith("test_") for part in n.split("."))}
    return found


def test_no_test_module_imports_another():
    """A test module's shared pieces (fakes, cases, fixtures) live in tests/support or a conftest: importing
    one test module from another runs the other's module code too and ties the two together."""
    sample = ("from tests.unit.test_a import x\nimport tests.integration.test_b\nfrom tests.unit import test_c\n"
              "from .test_d import y\nfrom tests.support.kafka import z\nimport json\n")
    assert imported_test_modules(sample) == {"tests.unit.test_a.x", "tests.integration.test_b",
                                             "tests.unit.test_c", ".test_d.y"}
    importing = {f"{path.relative_to(TESTS)}: {name}" for path in sorted(TESTS.rglob("*.py"))
                 for name in imported_test_modules(path.read_text())}
    assert not importing

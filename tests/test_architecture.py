"""The package's layers: every import points down, and the Kafka-free layers never import Kafka.

Layers, lowest first (docs/architecture.md):

    core  <  algorithms  <  engine  <  service | evaluation  <  devtools | console  <  cli

``service`` and ``evaluation`` stand side by side and do not import each other; so do
``devtools`` and ``console``.
The imports are read from the source (``ast``), including imports inside functions,
so a lazy upward import is caught as well.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "streamsemi"

#: layer -> rank; a module may import only layers of a strictly lower rank or its own layer.
RANK = {"core": 0, "algorithms": 1, "engine": 2, "service": 3, "evaluation": 3, "devtools": 4, "console": 4,
        "cli": 5}
#: layers that must not talk to Kafka (directly or through kafka-python).
KAFKA_FREE = {"core", "algorithms", "engine", "evaluation"}
#: top-level modules that are not a layer of their own.
PACKAGE_ROOT = {"__init__", "__main__"}


def layer_of(module: str) -> str | None:
    """The layer of a dotted ``streamsemi.*`` module name (None for the package root)."""
    parts = module.split(".")
    if parts[0] != "streamsemi":
        raise ValueError(f"not a streamsemi module: {module}")
    if len(parts) == 1 or parts[1] in PACKAGE_ROOT:
        return None
    return parts[1]


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """``(line, absolute module name)`` of every import in ``path`` (relative imports resolved)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    own = module_name(path)
    package = own if path.name == "__init__.py" else own.rpartition(".")[0]
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.append((node.lineno, mod))
            # ``from streamsemi import datasets`` imports the submodule streamsemi.datasets
            if mod == "streamsemi":
                out.extend((node.lineno, f"streamsemi.{alias.name}") for alias in node.names
                           if alias.name != "__version__")
    return out


def all_modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def violations(paths: list[Path]) -> list[str]:
    found = []
    for path in paths:
        here = layer_of(module_name(path))
        if here is None:
            continue
        assert here in RANK, f"{path}: module in an unknown layer {here!r}; add it to RANK and docs/architecture.md"
        for line, mod in imported_modules(path):
            top = mod.split(".")[0]
            if top == "kafka" and here in KAFKA_FREE:
                found.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {mod} (layer {here} must not use Kafka)")
            if top != "streamsemi":
                continue
            there = layer_of(mod)
            if there is None or there == here:
                continue
            if RANK[there] >= RANK[here]:
                found.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {mod}: layer {here} "
                             f"(rank {RANK[here]}) may not import layer {there} (rank {RANK[there]})")
    return found


def test_every_package_directory_is_a_known_layer():
    dirs = {p.name for p in PACKAGE.iterdir() if p.is_dir() and not p.name.startswith("__")}
    mods = {p.stem for p in PACKAGE.glob("*.py")} - PACKAGE_ROOT
    assert dirs | mods == set(RANK), f"layers on disk {sorted(dirs | mods)} vs declared {sorted(RANK)}"


def test_imports_point_down_and_lower_layers_do_not_use_kafka():
    assert violations(all_modules()) == []


@pytest.mark.parametrize("layer,source,expected", [
    ("core", "from streamsemi.engine import Engine\n", "layer core (rank 0) may not import layer engine"),
    ("algorithms", "def f():\n    from streamsemi.service import config\n",
     "layer algorithms (rank 1) may not import layer service"),
    ("service", "import streamsemi.evaluation.metrics\n", "layer service (rank 3) may not import layer evaluation"),
    ("engine", "from kafka import KafkaConsumer\n", "layer engine must not use Kafka"),
    ("core", "from . import store\nfrom ..engine import Engine\n", "may not import layer engine"),
])
def test_the_checker_catches_upward_and_kafka_imports(tmp_path, monkeypatch, layer, source, expected):
    """The check itself: a planted upward import (also lazy or relative) is reported."""
    root = tmp_path / "streamsemi"
    (root / "core").mkdir(parents=True)
    target = root / layer / "planted.py" if layer != "engine" else root / "engine.py"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(source, encoding="utf-8")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", root)
    found = violations([target])
    assert len(found) == 1 and expected in found[0], found


def test_clean_imports_pass_the_checker(tmp_path, monkeypatch):
    root = tmp_path / "streamsemi"
    (root / "service").mkdir(parents=True)
    target = root / "service" / "fine.py"
    target.write_text("import kafka\nfrom streamsemi.engine import Engine\nfrom streamsemi.core import logs\n"
                      "from streamsemi import __version__\n", encoding="utf-8")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", root)
    assert violations([target]) == []

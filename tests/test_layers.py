"""The packages of src/grpolab keep their layers: the application (``grpolab.app``) sits on top and nothing below it
imports it; ``checkpoint``, ``plan`` and ``report`` are libraries (``report`` knows nothing of training); and no two
top-level units (a subpackage, or a module at the top of grpolab) import each other, directly or round a circle.

Read from the source with ``ast`` (nothing is imported). Every ``grpolab`` import counts: at module level or inside
a function, ``import``, ``from ... import``, ``from grpolab import x``, relative, and under ``if TYPE_CHECKING:``
(a type hint names the layer too). scripts/import_map.py draws the finer, module-level map.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "src" / "grpolab"
LIBRARIES = ("checkpoint", "plan", "report")  # below the application
TRAINING = ("module", "rollout", "callbacks", "algo", "forward", "models")  # what report/ must not import
# The root grpolab/__init__.py imports grpolab.app.hydra_names so that importing any grpolab module registers the
# grpolab_dirname resolver conf/hydra/default.yaml names run folders with: it is the package's entry, not a unit.
ROOT_INIT = "grpolab/__init__.py"

def module_of(path: Path, root: Path = PKG) -> str:
    """The dotted name of a file under ``root`` (``grpolab/app/run.py`` -> ``grpolab.app.run``)."""
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def exists(module: str, root: Path = PKG) -> bool:
    """Whether a dotted grpolab name is a module or package under ``root``."""
    path = root.parent.joinpath(*module.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def grpolab_imports(path: Path, root: Path = PKG) -> set[str]:
    """The grpolab modules ``path`` imports, anywhere in the file: ``from a.b import c`` is ``a.b.c`` when that is
    a module, else ``a.b``; so ``from grpolab import x`` is ``grpolab.x``."""
    me = module_of(path, root)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.split(".")[0] == "grpolab")
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolved against this file's package
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            if base.split(".")[0] != "grpolab":
                continue
            for a in node.names:
                out.add(f"{base}.{a.name}" if exists(f"{base}.{a.name}", root) else base)
    return out


def unit_of(module: str) -> str | None:
    """The top-level unit of a dotted grpolab name (``grpolab.app.run`` -> ``app``); None for ``grpolab``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def files(root: Path = PKG) -> list[Path]:
    return sorted(root.rglob("*.py"))


def rel(path: Path, root: Path = PKG) -> str:
    return path.relative_to(root.parent).as_posix()


def imports_of(prefix: str, where: list[Path], root: Path = PKG) -> set[tuple[str, str]]:
    """``(file, module)`` for each import of ``prefix`` or a module below it by the files in ``where``."""
    return {(rel(f, root), name) for f in where for name in grpolab_imports(f, root)
            if name == prefix or name.startswith(prefix + ".")}


def in_unit(unit: str) -> list[Path]:
    return [f for f in files() if f.relative_to(PKG).parts[0] in (unit, f"{unit}.py")]


def unit_graph(paths: list[Path], root: Path = PKG, leave_out: set[tuple[str, str]] = frozenset()) -> dict:
    """``{A: {B, ...}}``: a file of unit A imports from unit B (the root ``__init__.py`` and the
    ``(file, module)`` imports of ``leave_out`` left out)."""
    graph: dict[str, set[str]] = {}
    for f in paths:
        if rel(f, root) == ROOT_INIT:
            continue
        me = f.relative_to(root).parts[0].removesuffix(".py")
        graph.setdefault(me, set())
        for name in grpolab_imports(f, root):
            unit = unit_of(name)
            if unit and unit != me and exists(f"grpolab.{unit}", root) and (rel(f, root), name) not in leave_out:
                graph[me].add(unit)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[tuple[str, ...]]:
    """The strongly connected sets of two or more units, each sorted (scripts/import_map.py's Tarjan, the one the
    module-level map uses)."""
    spec = importlib.util.spec_from_file_location("import_map", PKG.parents[1] / "scripts" / "import_map.py")
    import_map = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(import_map)
    return sorted(tuple(c) for c in import_map.cycles(graph))


def _lines(pairs) -> str:
    return "; ".join(f"{a} -> {b}" for a, b in sorted(pairs))


def test_the_package_is_found():
    assert len(files()) > 100
    assert {"app", "checkpoint", "plan", "report", "rollout", "module", "models"} <= set(unit_graph(files()))


def test_nothing_below_the_application_imports_it():
    below = [f for f in files() if f.relative_to(PKG).parts[0] != "app" and rel(f) != ROOT_INIT]
    assert _lines(imports_of("grpolab.app", below)) == "", "imports the application from below it"


def test_the_root_package_imports_only_the_run_folder_names_from_the_application():
    assert imports_of("grpolab.app", [PKG / "__init__.py"]) == {(ROOT_INIT, "grpolab.app.hydra_names")}


@pytest.mark.parametrize("unit", LIBRARIES)
def test_the_libraries_do_not_import_the_application(unit):
    assert in_unit(unit)
    assert _lines(imports_of("grpolab.app", in_unit(unit))) == ""


@pytest.mark.parametrize("training", TRAINING)
def test_the_report_does_not_import_training_code(training):
    assert _lines(imports_of(f"grpolab.{training}", in_unit("report"))) == ""


def test_no_import_cycle_between_units():
    found = cycles(unit_graph(files()))
    assert not found, "import cycles between units: " + "; ".join(" <-> ".join(c) for c in found)


def test_the_parser_finds_every_kind_of_import_and_the_cycle_they_make(tmp_path):
    root = tmp_path / "grpolab"
    for sub in ("a", "b"):
        (root / sub).mkdir(parents=True)
        (root / sub / "__init__.py").write_text("")
    (root / "__init__.py").write_text("from grpolab.b import y  # the root: not a unit\n")
    (root / "a" / "x.py").write_text("def f():\n    from grpolab import c\n")  # lazy, `from grpolab import`
    (root / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import grpolab.b.y\n")
    (root / "b" / "y.py").write_text("from ..a.x import f\nfrom grpolab.a import x\n")  # relative; a module
    assert grpolab_imports(root / "b" / "y.py", root) == {"grpolab.a.x"}
    graph = unit_graph(files(root), root)
    assert graph == {"a": {"c"}, "b": {"a"}, "c": {"b"}}
    assert cycles(graph) == [("a", "b", "c")]
    assert imports_of("grpolab.a", files(root), root) == {("grpolab/b/y.py", "grpolab.a.x")}
    assert cycles(unit_graph(files(root), root, leave_out={("grpolab/b/y.py", "grpolab.a.x")})) == []
    assert cycles({"a": {"b"}, "b": set()}) == []

"""Print the import map of ``src/grpolab``: which package imports which, the imports that run upward, the cycles.

    python scripts/import_map.py            # summary; exit 1 on an upward import or a cycle
    python scripts/import_map.py --edges    # every module-level edge too

Layers, lowest first (a module may import its own layer and the layers below it, never above)::

    0  the leaf helpers not named below                         errors, distributed, lora, handle, checkpoint,
                                                                report, plan, run_files, sweep_signals, app's run_folder, ...
    1  algo, verifiers, tasks                                   pure maths, rewards, data
    2  config, models, warmstart                                settings and model building (use algo's config)
    3  forward                                                  the shared forward pass, Theorem 1's diagnostics
    4  rollout.engines                                          generation engines
    5  rollout                                                  the buffer, its schedule, the data module
    6  module, callbacks, evaluation, app.plan_from_config      the LightningModule and what plugs into Lightning
    7  app: run, preflight, sweep_jobs, sweep_resume, slurm     the application: wiring, checks, launchers

Imports inside ``if TYPE_CHECKING:`` are type hints, not dependencies, and are left out. A cycle is a strongly
connected set of two or more modules (function-local imports count: they are a dependency all the same).
"""
from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
LAYERS: list[tuple[str, int]] = [  # longest prefix wins; "grpolab" itself is layer 0
    ("grpolab", 0),
    ("grpolab.algo", 1), ("grpolab.verifiers", 1), ("grpolab.tasks", 1),
    ("grpolab.config", 2), ("grpolab.models", 2), ("grpolab.warmstart", 2),
    ("grpolab.forward", 3),
    ("grpolab.rollout.engines", 4),
    ("grpolab.rollout", 5),
    ("grpolab.module", 6), ("grpolab.callbacks", 6), ("grpolab.evaluation", 6),
    ("grpolab.app.plan_from_config", 6),
    ("grpolab.app.run", 7), ("grpolab.app.preflight", 7), ("grpolab.app.sweep_jobs", 7),
    ("grpolab.app.sweep_resume", 7), ("grpolab.app.slurm", 7),
]


def layer(module: str) -> int:
    """The layer of a dotted module name (see the module docstring)."""
    best = max((p for p, _ in LAYERS if module == p or module.startswith(p + ".")), key=len)
    return dict(LAYERS)[best]


def module_name(path: Path) -> str:
    rel = path.relative_to(SRC).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for sub in node.body:
                skip.update(id(n) for n in ast.walk(sub))
    return skip


def imports(path: Path, modules: set[str]) -> set[str]:
    """The grpolab modules that ``path`` imports (resolved to existing modules; type-checking imports left out)."""
    me = module_name(path)
    pkg = me if path.name == "__init__.py" else me.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    skip = _type_checking_nodes(tree)
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            names = [f"{base}.{a.name}" for a in node.names] + [base]
        else:
            continue
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name != me and name.startswith("grpolab") and name != "grpolab":
                out.add(name)
    # a package import of a parent (e.g. "grpolab.rollout" for "from grpolab.rollout.x import y") is not an edge
    return {m for m in out if not any(o.startswith(m + ".") for o in out) or Path(SRC, *m.split(".")).is_file()}


def graph() -> dict[str, set[str]]:
    files = sorted(SRC.joinpath("grpolab").rglob("*.py"))
    modules = {module_name(f) for f in files}
    return {module_name(f): imports(f, modules) for f in files}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of two or more modules (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in g.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in g:
        if v not in index:
            visit(v)
    return out


def upward(g: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Edges (importer, imported) where the imported module sits in a higher layer."""
    return sorted((a, b) for a, bs in g.items() for b in bs if layer(b) > layer(a))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--edges", action="store_true", help="print every edge")
    args = ap.parse_args(argv)
    g = graph()
    if args.edges:
        for a in sorted(g):
            for b in sorted(g[a]):
                print(f"{a} -> {b}")
    up, cyc = upward(g), cycles(g)
    print(f"{len(g)} modules, {sum(map(len, g.values()))} imports, {len(up)} upward, {len(cyc)} cycles")
    for a, b in up:
        print(f"upward: {a} (layer {layer(a)}) -> {b} (layer {layer(b)})")
    for c in cyc:
        print("cycle: " + " <-> ".join(c))
    return 1 if up or cyc else 0


if __name__ == "__main__":
    raise SystemExit(main())

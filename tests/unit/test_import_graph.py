"""No import cycle in the package: every module parsed with `ast`, imports inside functions included.

Relative imports are resolved against the importing module's package; importing `a.b.c` also runs the
`__init__` of `a.b` (an edge to it), but a module's edges to its own parent packages are ignored (Python
has already started them when the module runs).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import edgebench


def module_files(root: Path) -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, is_package) for every .py file under the package folder `root`."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        found[".".join(parts)] = (path, is_package)
    return found


def imported_names(tree: ast.AST, package: str) -> set[str]:
    """Every dotted name an import statement anywhere in the tree may load (module, or module.attribute)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names.add(target)
            names.update(f"{target}.{alias.name}" for alias in node.names)  # `from pkg import module`
    return names


def import_graph(root: Path) -> dict[str, set[str]]:
    modules = module_files(root)
    graph: dict[str, set[str]] = {}
    for name, (path, is_package) in modules.items():
        package = name if is_package else name.rpartition(".")[0]
        edges = set()
        for target in imported_names(ast.parse(path.read_text(), str(path)), package):
            parts = target.split(".")
            # The target itself and every package above it (their __init__ runs first).
            for i in range(1, len(parts) + 1):
                candidate = ".".join(parts[:i])
                if candidate in modules and candidate != name and not name.startswith(candidate + "."):
                    edges.add(candidate)
        graph[name] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as a path [a, b, ..., a], or None (iterative depth-first search, three colours)."""
    colour = dict.fromkeys(graph, 0)  # 0 new, 1 on the current path, 2 done
    for start in sorted(graph):
        if colour[start]:
            continue
        path, stack = [start], [iter(sorted(graph[start]))]
        colour[start] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                colour[path.pop()] = 2
                stack.pop()
            elif colour[nxt] == 1:
                return path[path.index(nxt) :] + [nxt]
            elif colour[nxt] == 0:
                colour[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(graph[nxt])))
    return None


def test_the_package_has_no_import_cycle() -> None:
    root = Path(edgebench.__file__).parent
    graph = import_graph(root)
    assert "edgebench.execution.session" in graph and len(graph) > 50
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_check_finds_a_cycle_made_by_a_lazy_relative_import(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .sub.b import thing\n")
    (pkg / "sub" / "b.py").write_text("def thing():\n    from ..a import other\n")
    (pkg / "sub" / "c.py").write_text("from . import b\nimport pkg.sub\n")  # parent package: no edge
    graph = import_graph(pkg)
    assert graph["pkg.sub.c"] == {"pkg.sub.b"}
    assert graph["pkg.a"] == {"pkg.sub", "pkg.sub.b"}
    assert find_cycle(graph) == ["pkg.a", "pkg.sub.b", "pkg.a"]


def test_the_cli_starts_without_the_heavy_libraries() -> None:
    """Every verb starts the whole CLI: scipy alone cost a second of each start (1.8 s against 0.75 s), so
    the statistics, report and lab libraries are imported where they are used."""
    code = (
        "import sys\nfrom edgebench.cli import main\ntry:\n    main(['--version'])\nexcept SystemExit:\n"
        "    pass\nprint('loaded:' + ','.join(sorted(m for m in HEAVY if m in sys.modules)))"
    )
    heavy = (
        "scipy",
        "pandas",
        "matplotlib",
        "onnxruntime",
        "MNN",
        "dask",
        "distributed",
        "paramiko",
        "sklearn",
    )
    res = subprocess.run(
        [sys.executable, "-c", f"HEAVY = {heavy!r}\n{code}"], capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().splitlines()[-1] == "loaded:", res.stdout

"""Code fingerprints: a short hash of the ``dpace`` modules a job's script runs.

Snakemake reruns a script job when its script file changes, not when the package it calls
changes; putting this hash in a rule's params makes an edit to, say, the training code rerun
training while an edit to table rendering does not.

The modules are not listed by hand (such lists drift: they missed ``dpace.drafter`` under
features): they are the ``dpace`` modules the script imports, followed transitively through
every ``import`` statement of the package, including those inside functions (the backends are
imported lazily), so an edit to any module a job can run changes its fingerprint.
"""

from __future__ import annotations

import ast
import hashlib
from pathlib import Path

PACKAGE = "dpace"
PACKAGE_DIR = Path(__file__).resolve().parent


def _imported_modules(source: str, package_dir: Path) -> set[str]:
    """Names of the ``dpace`` modules (``"features"`` for ``dpace.features``) that ``source`` imports
    anywhere, at top level or inside a function or branch."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # `from dpace import tables` imports dpace.tables; `from dpace.x import f` imports dpace.x.
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == PACKAGE and len(parts) == 2 and (package_dir / f"{parts[1]}.py").exists():
                found.add(parts[1])
    return found


def module_closure(roots, package_dir: Path = PACKAGE_DIR) -> list[str]:
    """``roots`` and every ``dpace`` module they import, transitively, sorted."""
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        path = package_dir / f"{module}.py"
        if not path.exists():
            raise FileNotFoundError(f"no module {PACKAGE}.{module} ({path})")
        seen.add(module)
        todo += _imported_modules(path.read_text(), package_dir) - seen
    return sorted(seen)


def script_modules(script: str | Path, package_dir: Path = PACKAGE_DIR) -> list[str]:
    """Every ``dpace`` module that ``script`` (a workflow script) can run, by the import graph."""
    return module_closure(_imported_modules(Path(script).read_text(), package_dir), package_dir)


def code_fingerprint(*modules: str, package_dir: Path = PACKAGE_DIR) -> str:
    """Hash of the named modules' source (names and bytes, in sorted order)."""
    digest = hashlib.sha256()
    for module in sorted(set(modules)):
        path = package_dir / f"{module}.py"
        if not path.exists():
            raise FileNotFoundError(f"no module {PACKAGE}.{module} ({path})")
        digest.update(module.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def script_fingerprint(script: str | Path, package_dir: Path = PACKAGE_DIR) -> str:
    """The fingerprint of every ``dpace`` module ``script`` runs (see ``script_modules``)."""
    return code_fingerprint(*script_modules(script, package_dir), package_dir=package_dir)

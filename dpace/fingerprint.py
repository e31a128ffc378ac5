"""Code fingerprints: a short hash of the ``dpace`` modules a job's script runs.

Snakemake reruns a script job when its script file changes, not when the package it calls
changes; putting this hash in a rule's params makes an edit to, say, the training code rerun
training while an edit to table rendering does not.

The modules are not listed by hand (such lists drift: they missed ``dpace.training.drafter`` under
features): they are the ``dpace`` modules the script imports, followed transitively through
every ``import`` statement of the package, including those inside functions (the backends are
imported lazily), so an edit to any module a job can run changes its fingerprint. Modules go by their
dotted names (``dpace.report.tables.main`` is ``dpace/report/tables/main.py``); importing one runs the
``__init__.py`` of every package above it (``dpace``, ``dpace.report``, ``dpace.report.tables``), so those count too.

One module is finer-grained for training: ``dpace.training.objectives`` holds every objective, and a drafter
runs only one of them. ``objective_sources`` splits it into the code every objective shares and one
part per objective (its registry record and its weight function), so a training job fingerprinted
for its objective (``script_fingerprint(..., objective=...)``) reruns when the shared code or its own
objective changes, and not when another objective is added or edited.
"""

from __future__ import annotations

import ast
import hashlib
from pathlib import Path

PACKAGE = "dpace"
PACKAGE_DIR = Path(__file__).resolve().parent
OBJECTIVES_MODULE = "dpace.training.objectives"
RECORD_CLASS = "Objective"  # REGISTRY's records are ``Objective("name", ..., weights_function, ...)`` calls


def module_path(module: str, package_dir: Path = PACKAGE_DIR) -> Path | None:
    """The source file of ``module`` (a dotted name under ``dpace``): ``dpace/a/b.py`` for a module,
    ``dpace/a/b/__init__.py`` for a package, None for a name that is neither (a function or class)."""
    parts = module.split(".")
    if parts[0] != PACKAGE:
        return None
    folder = package_dir.joinpath(*parts[1:])
    if len(parts) > 1 and folder.with_suffix(".py").is_file():
        return folder.with_suffix(".py")
    return folder / "__init__.py" if (folder / "__init__.py").is_file() else None


def _with_packages(module: str) -> list[str]:
    """``module`` and the packages Python runs before it: ``dpace.a.b`` imports ``dpace`` and ``dpace.a`` first."""
    parts = module.split(".")
    return [".".join(parts[:n]) for n in range(1, len(parts) + 1)]


def _imported_modules(source: str, package_dir: Path) -> set[str]:
    """Dotted names of the ``dpace`` modules and packages (``"dpace.report.tables.main"``) that ``source``
    imports anywhere, at top level or inside a function or branch, with the packages above them."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # `from dpace.report import figures` imports dpace.report.figures; `from dpace.x import f` imports dpace.x.
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            if module_path(name, package_dir) is not None:
                found.update(_with_packages(name))
    return found


def module_closure(roots, package_dir: Path = PACKAGE_DIR) -> list[str]:
    """``roots`` and every ``dpace`` module they import, transitively, sorted."""
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        path = module_path(module, package_dir)
        if path is None:
            raise FileNotFoundError(f"no module {module} under {package_dir}")
        seen.add(module)
        todo += _imported_modules(path.read_text(), package_dir) - seen
    return sorted(seen)


def script_modules(script: str | Path, package_dir: Path = PACKAGE_DIR) -> list[str]:
    """Every ``dpace`` module that ``script`` (a workflow script) can run, by the import graph."""
    return module_closure(_imported_modules(Path(script).read_text(), package_dir), package_dir)


def _is_record(node: ast.AST) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == RECORD_CLASS
            and bool(node.args) and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str))


class _WithoutRecords(ast.NodeTransformer):
    """Drops every ``Objective("<name>", ...)`` call (from the registry's tuple: the tuple shrinks)."""

    def visit_Call(self, node: ast.Call):
        return None if _is_record(node) else self.generic_visit(node)


def objective_sources(source: str) -> tuple[str, dict[str, str]]:
    """``dpace.training.objectives``'s code split into (the code every objective shares, {objective: its own code}).

    An objective's own code is its ``Objective("<name>", ...)`` record in the registry plus the module-level
    weight function the record names, with any other record's weight function that one calls (a function two
    records reach, like D-PACE's and D-PAKL's, belongs to both); the shared code is everything else. Both are compared as syntax trees (``ast.dump``), so comments,
    blank lines and where a record sits do not count: a new record and its function leave the shared code as
    it was. Any code that is not a record or a weight function stays shared, so nothing escapes the fingerprint.
    """
    tree = ast.parse(source)
    functions = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
    named = {}  # record -> the module-level function its ``weights`` names, if any
    for record in (node for node in ast.walk(tree) if _is_record(node)):
        weights = record.args[4] if len(record.args) > 4 else next(
            (keyword.value for keyword in record.keywords if keyword.arg == "weights"), None)
        named[record] = weights.id if isinstance(weights, ast.Name) and weights.id in functions else None
    weight_functions = {name for name in named.values() if name}
    own: dict[str, str] = {}
    for record, function in named.items():
        # Its weight function and every other weight function that one calls (those are cut from the shared code).
        reached, todo = [], [function] if function else []
        while todo:
            name = todo.pop()
            if name not in reached:
                reached.append(name)
                todo += [node.id for node in ast.walk(functions[name])
                         if isinstance(node, ast.Name) and node.id in weight_functions]
        own[record.args[0].value] = "\n".join([ast.dump(record), *(ast.dump(functions[name]) for name in reached)])
    tree.body = [node for node in tree.body if not (isinstance(node, ast.FunctionDef) and node.name in weight_functions)]
    return ast.dump(_WithoutRecords().visit(tree)), own


def code_fingerprint(*modules: str, package_dir: Path = PACKAGE_DIR, objective: str | None = None) -> str:
    """Hash of the named modules' source (names and bytes, in sorted order).

    With ``objective``, ``dpace.training.objectives`` counts only its shared code and that objective's own code
    (``objective_sources``): adding or editing another objective leaves the hash as it is.
    """
    digest = hashlib.sha256()
    for module in sorted(set(modules)):
        path = module_path(module, package_dir)
        if path is None:
            raise FileNotFoundError(f"no module {module} under {package_dir}")
        digest.update(module.encode())
        if module == OBJECTIVES_MODULE and objective is not None:
            shared, own = objective_sources(path.read_text())
            if objective not in own:
                raise ValueError(f"no {RECORD_CLASS}({objective!r}, ...) record in {path}; records: {', '.join(own)}")
            digest.update(shared.encode())
            digest.update(own[objective].encode())
        else:
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def script_fingerprint(script: str | Path, package_dir: Path = PACKAGE_DIR, objective: str | None = None) -> str:
    """The fingerprint of every ``dpace`` module ``script`` runs (see ``script_modules``); with ``objective``,
    of only the part of ``dpace.training.objectives`` that objective runs (see ``code_fingerprint``)."""
    return code_fingerprint(*script_modules(script, package_dir), package_dir=package_dir, objective=objective)

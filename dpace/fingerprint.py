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

Two modules are finer-grained for training: ``dpace.objective_records`` (every objective's record) and
``dpace.training.objectives`` (every objective's weight function) hold every objective, and a drafter runs only
one of them. ``objective_sources`` splits each into the code every objective shares and one part per objective
(its record, its weight function), so a training job fingerprinted for its objective
(``script_fingerprint(..., objective=...)``) reruns when the shared code or its own objective changes, and not
when another objective is added or edited.

The versions of the installed packages that shape the numbers (``SHAPING_PACKAGES``: torch, transformers,
specforge, dflash, sglang) count too, those the job's code imports (the script and its ``dpace`` modules,
``shaping_versions``): an upgrade of torch reruns every job that runs torch, and leaves the data jobs alone.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
from importlib import metadata
from pathlib import Path

PACKAGE = "dpace"
PACKAGE_DIR = Path(__file__).resolve().parent
# The modules split per objective: its record (``Objective("<name>", ...)`` calls of the registry) lives in the
# first, its weight function (an entry ``"<name>": function`` of the ``WEIGHTS`` dict) in the second.
OBJECTIVE_MODULES = ("dpace.objective_records", "dpace.training.objectives")
RECORD_CLASS = "Objective"
WEIGHTS_DICT = "WEIGHTS"
# Installed packages whose version can change a job's numbers (their distribution names): part of the fingerprint
# of every job whose code imports them. An absent one (sglang on a CPU machine) counts as absent.
SHAPING_PACKAGES = ("torch", "transformers", "specforge", "dflash", "sglang")


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


@functools.cache  # by content: every DAG build fingerprints ~25 scripts over the same modules
def _imported_modules(source: str, package_dir: Path) -> frozenset[str]:
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
    return frozenset(found)


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


def _weights_dict(tree: ast.Module) -> ast.Dict | None:
    """The ``WEIGHTS = {...}`` literal of a module, if any."""
    for node in tree.body:
        target = node.target if isinstance(node, ast.AnnAssign) else (node.targets[0] if isinstance(node, ast.Assign) else None)
        if isinstance(target, ast.Name) and target.id == WEIGHTS_DICT and isinstance(node.value, ast.Dict):
            return node.value
    return None


def _records(tree: ast.Module) -> dict[str, list[ast.AST]]:
    """Each objective's own nodes: its ``Objective("<name>", ...)`` call, or its key and value in ``WEIGHTS``."""
    records = {node.args[0].value: [node] for node in ast.walk(tree) if _is_record(node)}
    weights = _weights_dict(tree)
    for key, value in zip(weights.keys, weights.values, strict=True) if weights else ():
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            records[key.value] = [key, value]
    return records


class _WithoutRecords(ast.NodeTransformer):
    """Drops every ``Objective("<name>", ...)`` call (from the registry's tuple: the tuple shrinks) and every
    entry of ``WEIGHTS``."""

    def __init__(self, weights: ast.Dict | None):
        self.weights = weights

    def visit_Call(self, node: ast.Call):
        return None if _is_record(node) else self.generic_visit(node)

    def visit_Dict(self, node: ast.Dict):
        if node is self.weights:
            node.keys, node.values = [], []
        return self.generic_visit(node)


@functools.cache
def objective_sources(source: str) -> tuple[str, dict[str, str]]:
    """A module split per objective (``OBJECTIVE_MODULES``) into (the code every objective shares, {objective: its
    own code}).

    An objective's own code is its record (its ``Objective("<name>", ...)`` call, or its entry in ``WEIGHTS``) plus
    the module-level functions the record names, with any other record's function that one calls (a function two
    records reach, like D-PACE's and D-PAKL's weights, belongs to both); the shared code is everything else. Both
    are compared as syntax trees (``ast.dump``), so comments, blank lines and where a record sits do not count: a
    new record and its function leave the shared code as it was. Any code that is not a record or a function a
    record names stays shared, so nothing escapes the fingerprint.
    """
    tree = ast.parse(source)
    functions = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
    records = _records(tree)
    named = {name: sorted({n.id for node in nodes for n in ast.walk(node) if isinstance(n, ast.Name) and n.id in functions})
             for name, nodes in records.items()}
    record_functions = {function for names in named.values() for function in names}
    own: dict[str, str] = {}
    for name, nodes in records.items():
        # Its functions and every other record's function that those call (those are cut from the shared code).
        reached, todo = [], list(named[name])
        while todo:
            function = todo.pop()
            if function not in reached:
                reached.append(function)
                todo += [node.id for node in ast.walk(functions[function])
                         if isinstance(node, ast.Name) and node.id in record_functions]
        own[name] = "\n".join([*(ast.dump(node) for node in nodes), *(ast.dump(functions[f]) for f in sorted(reached))])
    weights = _weights_dict(tree)
    tree.body = [node for node in tree.body if not (isinstance(node, ast.FunctionDef) and node.name in record_functions)]
    return ast.dump(_WithoutRecords(weights).visit(tree)), own


def code_fingerprint(*modules: str, package_dir: Path = PACKAGE_DIR, objective: str | None = None) -> str:
    """Hash of the named modules' source (names and bytes, in sorted order).

    With ``objective``, each module of OBJECTIVE_MODULES counts only its shared code and that objective's own code
    (``objective_sources``): adding or editing another objective leaves the hash as it is.
    """
    digest = hashlib.sha256()
    for module in sorted(set(modules)):
        path = module_path(module, package_dir)
        if path is None:
            raise FileNotFoundError(f"no module {module} under {package_dir}")
        digest.update(module.encode())
        if module in OBJECTIVE_MODULES and objective is not None:
            shared, own = objective_sources(path.read_text())
            if objective not in own:
                raise ValueError(f"no record of objective {objective!r} in {path}; records: {', '.join(own)}")
            digest.update(shared.encode())
            digest.update(own[objective].encode())
        else:
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


@functools.cache
def _imported_packages(source: str) -> frozenset[str]:
    """Top-level names of every absolute import of ``source`` (``torch`` for ``from torch.nn import Module``)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return frozenset(found)


def package_version(package: str) -> str:
    """The installed version of ``package``, or ``"absent"``."""
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "absent"


def shaping_versions(script: str | Path, package_dir: Path = PACKAGE_DIR) -> dict[str, str]:
    """{package: installed version} of the SHAPING_PACKAGES that ``script`` or a ``dpace`` module it runs imports."""
    sources = [Path(script).read_text()] + [module_path(m, package_dir).read_text()
                                            for m in script_modules(script, package_dir)]
    imported = set().union(*(_imported_packages(source) for source in sources))
    return {package: package_version(package) for package in SHAPING_PACKAGES if package in imported}


def script_fingerprint(script: str | Path, package_dir: Path = PACKAGE_DIR, objective: str | None = None) -> str:
    """The fingerprint of every ``dpace`` module ``script`` runs (see ``script_modules``); with ``objective``,
    of only the part of the OBJECTIVE_MODULES that objective runs (see ``code_fingerprint``); and of the versions
    of the SHAPING_PACKAGES that code imports (``shaping_versions``), so an upgrade reruns the jobs that run them."""
    code = code_fingerprint(*script_modules(script, package_dir), package_dir=package_dir, objective=objective)
    versions = json.dumps(shaping_versions(script, package_dir), sort_keys=True)
    return hashlib.sha256(f"{code}\n{versions}".encode()).hexdigest()[:16]

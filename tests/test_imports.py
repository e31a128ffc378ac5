"""The package's imports follow the DAG: parsing the Snakefile (dpace.config, dpace.experiments) loads no torch,
and no stage imports a later stage."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dpace.fingerprint import PACKAGE_DIR, _imported_modules, module_path

REPO = Path(__file__).resolve().parents[1]

# The stages in DAG order (dpace/__init__.py); a module outside them is shared.
STAGES = ("dpace.data", "dpace.targets", "dpace.responses", "dpace.features", "dpace.training", "dpace.evaluation",
          "dpace.report")


def stage(module: str) -> int | None:
    return next((i for i, name in enumerate(STAGES) if module == name or module.startswith(name + ".")), None)


def test_the_snakefile_imports_load_no_torch():
    """What every Snakefile parse imports (workflow/rules/common.smk) leaves torch out of sys.modules."""
    code = ("import sys, dpace.config, dpace.claims, dpace.experiments, dpace.objective_records, "
            "dpace.training.train_config; dpace.claims.validate_claims(); "
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "[]"


MODULES = sorted(".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
                 for path in PACKAGE_DIR.rglob("*.py") if "__pycache__" not in path.parts)


@pytest.mark.parametrize("module", [m for m in MODULES if stage(m) is not None])
def test_no_stage_imports_a_later_stage(module):
    imported = _imported_modules(module_path(module).read_text(), PACKAGE_DIR)
    later = sorted(m for m in imported if (stage(m) or -1) > stage(module))
    assert not later, f"{module} imports {later}, of a later stage"

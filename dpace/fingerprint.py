"""Code fingerprints: a short hash of the ``dpace`` modules a stage imports.

Snakemake reruns a script job when its script file changes, not when the package it calls
changes; putting this hash in a rule's params makes an edit to, say, the training code rerun
training while an edit to table rendering does not.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent


def code_fingerprint(*modules: str) -> str:
    digest = hashlib.sha256()
    for module in sorted(set(modules)):
        path = PACKAGE_DIR / f"{module}.py"
        if not path.exists():
            raise FileNotFoundError(f"no module dpace.{module} ({path})")
        digest.update(module.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


# The dpace modules each stage runs (directly or through imports), for the fingerprints above.
STAGE_MODULES = {
    "data": ("data", "io"),
    "target": ("targets", "io"),
    "generate": ("generation", "targets", "io"),
    "import": ("conversations", "io"),
    "features": ("features", "targets", "io"),
    "train": ("training", "objectives", "online_model", "drafter", "features", "targets", "gpus", "io"),
    "evaluate": ("evaluation", "decoding", "drafter", "targets", "gpus", "io"),
    "report": ("report", "tables", "figures", "io"),
}


def stage_fingerprint(stage: str) -> str:
    return code_fingerprint(*STAGE_MODULES[stage])

"""The config schema (workflow/schemas/config.schema.yaml): the one place where every config default and
every enum is written. Code that runs outside the workflow (tests, benchmarks, ``dpace.targets`` and
``dpace.training.loop`` called directly) reads its defaults and allowed values from here instead of keeping its
own. Imports only yaml, so that a job's code fingerprint does not grow by importing it."""

from __future__ import annotations

import copy
import functools
from pathlib import Path

SCHEMA = Path(__file__).resolve().parents[1] / "workflow" / "schemas" / "config.schema.yaml"


@functools.cache
def load_schema(schema_path: str | Path = SCHEMA) -> dict:
    import yaml

    # libyaml's loader where installed: every Snakemake run (and every job of a cluster run) loads this
    return yaml.load(Path(schema_path).read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def _section_schema(*keys: str) -> dict:
    """The schema of the config section at ``keys``; ``"*"`` steps into a mapping of named entries
    (``"targets", "*"``: every target's)."""
    node = load_schema()
    for key in keys:
        node = node["additionalProperties"] if key == "*" else node["properties"][key]
    return node


def schema_defaults(*keys: str) -> dict:
    """{key: default} of the section at ``keys``, for code that runs outside the workflow (tests,
    benchmarks, ``dpace.targets``) and must not keep defaults of its own."""
    return {key: copy.deepcopy(spec["default"]) for key, spec in _section_schema(*keys)["properties"].items()
            if "default" in spec}


def schema_enum(*keys: str) -> tuple:
    """The values the schema allows for the key at ``keys``: Python code that branches on an enum
    reads it from here, so the schema is the one place its values are listed."""
    return tuple(_section_schema(*keys[:-1])["properties"][keys[-1]]["enum"])

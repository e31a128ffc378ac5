"""The claims file (``workflow/claims.yaml``) checked before anything reads it: by its JSON schema
(``workflow/schemas/claims.schema.yaml``: every mapping refuses unknown keys), against the registries
(experiments, objectives, benchmarks), and by the rules a schema cannot express (unique ids, the units a
measure can be judged in). Every error names the file, the claim's id and the key.

The Snakefile calls :func:`validate_claims` when it loads (``workflow/rules/common.smk``), so a claims file
that would score a misspelt rule never starts a job; ``dpace.report.findings.read_claims`` calls it again on
the scorecard's own code path. Imports only yaml, jsonschema and the registries (no pandas), like
``dpace.config``.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

SCHEMA = Path(__file__).resolve().parents[1] / "workflow" / "schemas" / "claims.schema.yaml"
CLAIMS = Path(__file__).resolve().parents[1] / "workflow" / "claims.yaml"
NOT_MEASURABLE = "not_measurable"
# The units each measure can be judged in: only comparisons carry a reference to divide by; a step time is
# a ratio already (dpace.report.verdicts.SCALES).
SCALES_OF_KIND = {"comparison": ("absolute", "relative", "accepted"), "step_time": ("relative",)}
BENCHMARK_SELECTORS = {"comparison": ("avg", "every"), "contrast": ("avg",), "ratio": ("avg",)}


class ClaimsError(ValueError):
    """A claims file the scorecard would misread; the message names the file, the claim and the key."""


@functools.cache
def load_schema(schema_path: str | Path = SCHEMA) -> dict:
    import yaml

    # libyaml's loader where installed: every Snakemake run (and every job of a cluster run) loads this
    return yaml.load(Path(schema_path).read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def _key_path(path) -> str:
    return ".".join(str(p) for p in path)


def _schema_error(claims: list, path, schema: dict) -> ClaimsError:
    """The first schema error as one line: which claim, which key, what is allowed."""
    import jsonschema

    errors = list(jsonschema.Draft202012Validator(schema).iter_errors(claims))
    # The deepest error first: a wrong key inside a verdict, not "the claim does not match its allOf".
    error = max(errors, key=lambda e: (len(e.absolute_path), -errors.index(e)))
    while error.context:  # oneOf / anyOf: the branch that fits the value's type best
        fitting = [e for e in error.context if e.validator != "type"]
        best = jsonschema.exceptions.best_match(fitting or error.context)
        if best.validator in ("required", "not", "anyOf", "oneOf"):  # a shape with several branches: say all
            break
        error = best
    where = list(error.absolute_path)
    prefix = f"{path}"
    if where and isinstance(where[0], int):
        claim = claims[where[0]]
        name = claim.get("id", f"#{where[0] + 1}") if isinstance(claim, dict) else f"#{where[0] + 1}"
        prefix += f": claim {name!r}"
        where = where[1:]
    key = _key_path(where)
    at = f"{prefix}: {key}" if key else prefix
    if error.validator == "additionalProperties":
        allowed = sorted(error.schema.get("properties", {}))
        extra = sorted(set(error.instance) - set(allowed))
        return ClaimsError(f"{at}: unknown key(s) {extra}; allowed: {allowed}")
    if error.validator == "required":
        missing = [k for k in error.validator_value if k not in error.instance]
        return ClaimsError(f"{at} lacks {missing}" if key else f"{prefix} lacks {missing}")
    if where[-1:] == ["verdict"] and error.validator in ("anyOf", "not"):
        return ClaimsError(f"{at}: {error.instance} is no region; write one of {{above: a}}, {{below: b}}, "
                           "{above: a, below: b}, {between: [a, b]}, {paper_factor: f}")
    if error.validator == "anyOf" and where[-2:-1] == ["paper_cells"]:
        return ClaimsError(f"{at}: a paper cell needs `value`, or `tau` with `dflash`")
    if error.validator == "not" and not key:
        kind = claims[list(error.absolute_path)[0]]["measure"].get("kind")
        keys = "paper_value, paper_cells, verdict or gradient" if kind == NOT_MEASURABLE else "reason"
        return ClaimsError(f"{at}: a {kind} claim takes no {keys}")
    return ClaimsError(f"{at}: {error.message}")


def _registry_errors(claim: dict) -> list[str]:
    """Names that refer to a registry and name nothing in it: ``key: 'value' is not ...; valid: ...``."""
    from dpace.data import BENCHMARKS
    from dpace.experiments import EXPERIMENT_SPECS
    from dpace.objective_records import OBJECTIVE_ALIASES, REGISTRY

    errors = []

    def check(key: str, value, valid, what: str, hint: str = "") -> None:
        if value is not None and value not in valid:
            errors.append(f"{key}: {value!r} is not {what}{hint}; valid: {', '.join(valid)}")

    def objective(key: str, value) -> None:
        hint = f" (write its canonical name {OBJECTIVE_ALIASES[value]!r})" if value in OBJECTIVE_ALIASES else ""
        check(key, value, list(REGISTRY), "an objective", hint)

    measure, gradient = claim["measure"], claim.get("gradient", {})
    kind = measure["kind"]
    check("measure.experiment", measure.get("experiment"), list(EXPERIMENT_SPECS), "an experiment")
    objective("measure.objective", measure.get("objective"))
    for part in ("terms", "numerator", "denominator"):
        for i, term in enumerate(measure.get(part, [])):
            objective(f"measure.{part}.{i}.objective", term.get("objective"))
    check("measure.benchmark", measure.get("benchmark"), [*BENCHMARK_SELECTORS.get(kind, ()), *BENCHMARKS],
          "a benchmark")
    check("gradient.experiment", gradient.get("experiment"), list(EXPERIMENT_SPECS), "an experiment")
    check("gradient.benchmark", gradient.get("benchmark"), list(BENCHMARKS), "a benchmark")
    for key in ("stratifier", "objective"):
        objective(f"gradient.{key}", gradient.get(key))
    return errors


def _rule_errors(claim: dict) -> list[str]:
    """What the schema cannot say: the claim's unit must apply to its measure, a band must be ordered."""
    kind, rule = claim["measure"]["kind"], claim.get("verdict", {})
    errors = []
    allowed = SCALES_OF_KIND.get(kind, ("absolute",))
    scale = rule.get("scale", "absolute" if kind != "step_time" else None)
    if kind != NOT_MEASURABLE and scale not in allowed:
        errors.append(f"verdict.scale: {rule.get('scale')!r} does not apply to a {kind} measure "
                      f"(allowed: {', '.join(allowed)})")
    if "between" in rule and not rule["between"][0] < rule["between"][1]:
        errors.append(f"verdict.between: {rule['between']} is empty; write [low, high] with low < high")
    if "above" in rule and "below" in rule and not rule["above"] < rule["below"]:
        errors.append(f"verdict: above {rule['above']} and below {rule['below']} leave no region")
    if "paper_factor" in rule and not claim.get("paper_cells"):
        errors.append("verdict.paper_factor needs paper_cells")
    return errors


def check_claims(claims, path: str | Path = "claims") -> list[dict]:
    """``claims`` (the parsed file) when it is valid; else ``ClaimsError`` naming the file, claim and key."""
    import jsonschema

    schema = load_schema()
    if not jsonschema.Draft202012Validator(schema).is_valid(claims):
        if not isinstance(claims, list):
            raise ClaimsError(f"{path}: expected a list of claims, got {type(claims).__name__}")
        raise _schema_error(claims, path, schema)
    seen, id_pattern = set(), schema["$defs"]["claim"]["properties"]["id"]["pattern"]
    for claim in claims:
        if not re.fullmatch(id_pattern, claim["id"]):  # the schema's pattern searches: "$" lets a trailing newline by
            raise ClaimsError(f"{path}: claim {claim['id']!r}: id: does not match {id_pattern} as a whole")
        if claim["id"] in seen:
            raise ClaimsError(f"{path}: claim id {claim['id']!r} appears twice")
        seen.add(claim["id"])
        errors = _registry_errors(claim) + _rule_errors(claim)
        if errors:
            raise ClaimsError(f"{path}: claim {claim['id']!r}: {errors[0]}")
    return claims


def validate_claims(path: str | Path = CLAIMS) -> list[dict]:
    """The claims of ``path``, checked (:func:`check_claims`)."""
    import yaml

    try:
        claims = yaml.load(Path(path).read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError as error:
        raise ClaimsError(f"{path}: not valid YAML: {error}") from None
    return check_claims(claims, path)

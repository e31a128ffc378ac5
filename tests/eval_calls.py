"""The evaluation's entry points called as the tests write them: settings as keywords, gathered into the
EvalConfig / ReferenceSettings / TargetAnswers the functions take (the tests' defaults: local backend,
decoded tau, hard-match)."""

from __future__ import annotations

from dataclasses import fields

from dpace.evaluation.eval_config import EvalConfig, ReferenceSettings

TEST_DEFAULTS = {"backend": "local", "verification": "hard-match", "tau": "decode"}


def _take(kwargs: dict, names) -> dict:
    return {name: kwargs.pop(name) for name in list(kwargs) if name in names}


def eval_config(kwargs: dict) -> EvalConfig:
    """The EvalConfig of the settings in ``kwargs`` (removed from it)."""
    return EvalConfig.from_config({**TEST_DEFAULTS, **_take(kwargs, {f.name for f in fields(EvalConfig)})})


def evaluate(target_json, drafter_dir, files, **kwargs):
    from dpace.evaluation.evaluate import TargetAnswers, evaluate_drafter

    config = eval_config(kwargs)
    answers = TargetAnswers(**{name: kwargs.pop(f"{name}_path") for name in ("baseline", "reference", "features")
                               if f"{name}_path" in kwargs})
    return evaluate_drafter(target_json, drafter_dir, files, config, answers=answers, **kwargs)


def measure(target_json, files, **kwargs):
    from dpace.evaluation.evaluate import measure_baseline

    config = eval_config(kwargs)
    reference = ReferenceSettings(**_take(kwargs, {f.name for f in fields(ReferenceSettings)}))
    return measure_baseline(target_json, files, config, reference=reference, **kwargs)


def sglang(target_json, drafter_dir, files, **kwargs):
    from dpace.evaluation.sglang_backend import evaluate_sglang

    return evaluate_sglang(target_json, drafter_dir, files, eval_config(kwargs), **kwargs)

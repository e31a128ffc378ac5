"""One evaluation's settings (``EvalConfig``), built from the config's ``eval`` section and a suite's overrides.

The schema (workflow/schemas/config.schema.yaml) is the one home of every evaluation knob's default and
allowed values, as for ``dpace.training.train_config.TrainConfig``; this module reads both from there and
keeps the schema's names (``greedy_tie_margin``, ``decoded_prompts_per_benchmark``, ...) end to end. It
imports no torch: the workflow's rules and the SGLang backend build one without the decoding stack.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields

from dpace.schema import load_schema, schema_defaults, schema_enum

# The enums that code branches on, read from the schema (the one place their values are listed).
VERIFICATIONS = schema_enum("eval", "verification")  # hard-match, rejection (dpace.evaluation.decoding)
DECODE_CLOCKS = schema_enum("eval", "decode_clock")  # after-first-draft, after-prefill
TAU_COUNTS = schema_enum("eval", "tau_counts")  # accepted-plus-bonus, emitted (eval_records.summarize)
TAU_SOURCES = schema_enum("eval", "tau")  # replay, decode
# bf16 near-ties below this many logits are numerical ties, not failures (eval_records.divergence_verdict)
DEFAULTS = schema_defaults("eval")
GREEDY_TIE_MARGIN = DEFAULTS["greedy_tie_margin"]

# The eval settings the target's reference answers and times (measure_baseline) depend on, besides the seed
# and the temperatures: a change to another one (tau_counts, decode_clock, ...) reruns the evaluations only.
BASELINE_SETTINGS = ("max_new_tokens", "sampled_prompts_per_benchmark", "dtype", "shared_features")


@dataclass(frozen=True, kw_only=True)
class EvalConfig:
    """One evaluation's settings: every field named like a key of the config's ``eval`` section takes its
    value, and its default, from there (``from_config``); ``seed`` is the config's, ``temperatures`` and
    ``backend`` may be a suite's own, and ``tau`` is what the workflow resolved for the suite (replay only
    where the shared reference answers cover it). A new evaluation knob is a key in the schema and a field
    here. The whole dataclass is the cache key of the per-prompt records (``key``)."""

    backend: str | None = None  # None: the caller picks the backend (measure_baseline has none)
    temperatures: tuple[float, ...]
    verification: str | None = None  # None: no verification rule (the autoregressive baseline)
    max_new_tokens: int
    seed: int
    sampled_prompts_per_benchmark: int | None
    dtype: str
    decode_clock: str
    tau_counts: str
    greedy_tie_margin: float
    tau: str
    decoded_prompts_per_benchmark: int
    decoded_seeds: str  # the workflow resolves it into decoded_prompts_per_benchmark per drafter (0: a later seed)
    shared_features: bool
    baseline: str

    @classmethod
    def from_config(cls, section: dict, **overrides) -> EvalConfig:
        """The settings of ``section`` (a config's ``eval`` section, or part of one: the schema's defaults
        fill the rest) with ``overrides`` (the seed, a suite's temperatures and backend, the resolved tau)."""
        values = {**schema_defaults("eval"), **section, **overrides}
        names = {f.name for f in fields(cls)}
        unknown = set(values) - names
        if unknown:
            raise ValueError(f"unknown evaluation setting(s) {sorted(unknown)}; valid: {', '.join(sorted(names))}")
        values["temperatures"] = tuple(float(t) for t in values["temperatures"])
        config = cls(**values)
        config.check()
        return config

    def check(self) -> None:
        """The enums a caller outside the validated workflow (a test, a benchmark) might get wrong."""
        for name, spec in load_schema()["properties"]["eval"]["properties"].items():
            value, allowed = getattr(self, name), tuple(spec.get("enum", ()))
            if allowed and value is not None and value not in allowed:
                raise ValueError(f"eval.{name} must be one of {allowed}, got {value!r}")

    def key(self) -> dict:
        """The settings a per-prompt record was made with (``dpace.io.current_records``), JSON-shaped."""
        return json_shaped(asdict(self))

    def decodes(self, benchmark_rank: int, index: int, temperature: float) -> bool:
        """Whether replayed tau also decodes this request for real (its exactness check).

        The first ``decoded_prompts_per_benchmark`` prompts of each benchmark, the temperatures taken in turn:
        prompt ``index`` of the benchmark ranked ``benchmark_rank`` (its place among the evaluation's benchmark
        names, sorted) is decoded at temperature ``(benchmark_rank + index) mod len(temperatures)`` (ascending).
        So N decodes a benchmark (a decode is most of an evaluation's time) and every temperature is checked.
        """
        if index >= self.decoded_prompts_per_benchmark:
            return False
        temperatures = sorted(set(self.temperatures))
        return temperatures[(benchmark_rank + index) % len(temperatures)] == float(temperature)


@dataclass(frozen=True, kw_only=True)
class ReferenceSettings:
    """How ``measure_baseline`` makes the target's reference answers and features for replayed tau
    (settings of other sections, resolved by the workflow: ``REPLAY_OVERRUN``, ``BASELINE_TIMED_PROMPTS``,
    ``responses.batch_size``, ``features.*``, ``train.sliding_window``)."""

    overrun: int = 0  # tokens past a stop token (a block may have accepted them)
    timed_prompts: int | None = None  # the first N prompts decoded batch-1 and timed (None: all)
    batch_size: int = 1  # the other prompts' answers, in batches of this many
    feature_layer_ids: tuple[int, ...] | None = None  # None: the drafters' default layers
    num_target_features: int | None = None  # features.num_target_features, for the default layers
    feature_window: int = 0  # W > 0: features from W positions before the answer only

    def key(self) -> dict:
        """The settings the reference answers were made with (``ReferenceSettings``' cache key)."""
        return json_shaped(asdict(self))


def json_shaped(settings: dict) -> dict:
    """``settings`` as a record read back from JSON holds them (tuples as lists), to compare with one."""
    return json.loads(json.dumps(settings))

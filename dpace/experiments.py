"""The registry of experiments: one record (``ExperimentSpec``) per experiment of the config's ``experiments``
section, holding how its entry expands into drafter variants, which suites it evaluates besides the full one,
and the tables and figures it renders (``Artifact``), each with its renderer and what that renderer reads.

``dpace.config.experiments`` loops over this registry; the workflow's targets, inputs and evaluation suites
(workflow/rules/common.smk), the renderers (``dpace.report.render``) and the benchmark of each target's cost
(benchmarks/target_times.py) read it too. A new experiment is one record here plus its entry in the config
and the schema (docs/objectives.md, "Adding an experiment"); tests/test_experiments.py checks the registry.
Imports nothing heavy: the Snakefile reads it while it parses.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple


@dataclass(frozen=True)
class Suite:
    """Which benchmarks and temperatures an evaluation decodes, besides the config's full suite."""

    name: str
    benchmarks: tuple[str, ...]
    temperatures: tuple[float, ...]
    backend: str | None = None  # None: eval.backend

    def settings(self) -> dict:
        settings = {"benchmarks": list(self.benchmarks), "temperatures": list(self.temperatures)}
        return settings | ({"backend": self.backend} if self.backend else {})


class Setting(NamedTuple):
    """One benchmark at one temperature."""

    benchmark: str
    temperature: float


# MATH-500 at T = 0: the paper's setting for the per-epoch trajectory (Table 3, Figure 3c) and for the per-block
# records (Table 8, Figure 1a); the suites below decode it, the report's defaults select it.
MATH500_AT_T0 = Setting("math500", 0.0)
# Every epoch of the ablation run.
TRAJECTORY = Suite("trajectory", (MATH500_AT_T0.benchmark,), (MATH500_AT_T0.temperature,))
# Per-block q and tau when eval.backend is SGLang, which reports neither: the in-process decoder.
BLOCKS = Suite("blocks", (MATH500_AT_T0.benchmark,), (MATH500_AT_T0.temperature,), backend="local")

# What a renderer can be passed (``Artifact.arguments``): the experiments' metrics (seeds averaged) and
# comparisons, Table 1's per-block and training records, the output paths, and "reference:<objective>",
# the id of Table 1's reference drafter of that objective (``reference_drafter``).
RENDERER_INPUTS = ("metrics", "comparisons", "blocks", "train_steps", "train_runs", "out", "out_png")


@dataclass(frozen=True)
class Artifact:
    """One table or figure: its renderer is the function named like it in ``module``, called with ``arguments``,
    each an input of RENDERER_INPUTS (or ``reference:<objective>``), passed by keyword as ``"name=input"``."""

    name: str  # results/<name>.tex for a table, results/<name>.pdf (and .png) for a figure
    experiments: tuple[str, ...]  # whose metrics (and comparisons) it reads, where configured
    module: str  # the dotted module of its renderer (dpace.report.tables.main); render.py imports it
    arguments: tuple[str, ...] = ("metrics",)

    @property
    def kind(self) -> str:
        return "table" if self.name.startswith("table_") else "figure"

    @property
    def file(self) -> str:
        return f"{self.name}.tex" if self.kind == "table" else f"{self.name}.pdf"

    def inputs(self) -> list[str]:
        """The inputs its renderer reads, in order."""
        return [argument.split("=")[-1] for argument in self.arguments]

    @property
    def blocks(self) -> bool:
        """Reads Table 1's per-block records (main_blocks.csv)."""
        return "blocks" in self.inputs()

    @property
    def train(self) -> bool:
        """Reads Table 1's training records (main_train_steps.csv, main_train_runs.csv)."""
        return bool({"train_steps", "train_runs"} & set(self.inputs()))

    @property
    def references(self) -> tuple[str, ...]:
        """Objectives whose reference drafter (``reference_drafter``) it draws."""
        return tuple(i.split(":")[1] for i in self.inputs() if i.startswith("reference:"))


@dataclass(frozen=True)
class Request:
    """One drafter an experiment asks for; ``dpace.config`` resolves it into a ``Variant`` (None: the train
    section's value; target None: main_target). ``where`` names the config key an error points at."""

    objective: str
    where: str
    target: str | None = None
    depth: int | None = None
    block_size: int | None = None
    epochs: int | None = None
    normalization: str | None = None
    hparams: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class ExperimentSpec:
    """One experiment: how its config entry expands into drafters, and what it renders.

    ``expand(entry, config)`` gets the experiment's entry (schema defaults filled) and the whole config and
    returns its ``Request``s; ``eval_epoch(config)`` the checkpoint its tables read (None: each drafter's last).
    ``artifacts`` exist when this experiment is configured."""

    name: str
    expand: Callable[[dict, dict], list[Request]]
    artifacts: tuple[Artifact, ...] = ()
    every_epoch: Suite | None = None  # a suite evaluated after every epoch, not only the last
    eval_epoch: Callable[[dict], int | None] = lambda config: None
    # A claim reads its SR (workflow/claims.yaml): its drafters are timed together, interleaved, in one timing job
    # per target (dpace.evaluation.timing_run); the others' SR is not measured (their evaluations time nothing).
    times_speedup: bool = False


def _each_objective(name: str) -> Callable[[dict, dict], list[Request]]:
    """An experiment of one drafter per objective of its entry's ``objectives``, on the main target."""
    return lambda entry, config: [Request(o, f"experiments.{name}.objectives", epochs=entry.get("epochs"))
                                  for o in entry["objectives"]]


def _main_checkpoint(config: dict) -> tuple[int | None, int | None]:
    """(the epochs Table 1's drafters train, the epoch it reads): "final" trains train.epochs epochs (the cosine
    schedule ends there); "ablation-run" trains experiments.ablation.epochs and reads epoch train.epochs part-way
    through the schedule, as Table 3 does (the paper's Table 3 epoch-6 values equal its Table 1's, which suggests
    this reading)."""
    if config["experiments"]["main"]["checkpoint"] != "ablation-run":
        return None, None
    run_epochs = config["experiments"].get("ablation", {}).get("epochs")
    eval_epoch = int(config["train"]["epochs"])
    if run_epochs is None or int(run_epochs) < eval_epoch:
        raise ValueError("experiments.main.checkpoint: 'ablation-run' needs experiments.ablation.epochs >= "
                         f"train.epochs ({eval_epoch}), got {run_epochs}")
    return int(run_epochs), eval_epoch


def _main(entry: dict, config: dict) -> list[Request]:
    run_epochs, _ = _main_checkpoint(config)
    return [Request(objective, "experiments.main.objectives", depth=depth, epochs=run_epochs)
            for depth in entry.get("depths", [config["train"]["depth"]]) for objective in entry["objectives"]]


def _cross_model(entry: dict, config: dict) -> list[Request]:
    return [Request(objective, "experiments.cross_model", target=row["target"], depth=row.get("depth"),
                    block_size=row.get("block_size"))
            for row in entry["targets"] for objective in entry["objectives"]]


def _smoothing(entry: dict, config: dict) -> list[Request]:
    requests = []
    for row in entry.get("configs", [{"target": config["main_target"]}]):
        where = dict(target=row["target"], block_size=row.get("block_size"))
        requests.append(Request("dflash", "experiments.smoothing", **where))
        requests += [Request("dpace", "experiments.smoothing.alphas", hparams={"alpha": float(a)}, **where)
                     for a in entry["alphas"]]
    return requests


def _block_size(entry: dict, config: dict) -> list[Request]:
    return [Request(objective, "experiments.block_size.block_sizes", block_size=int(b))
            for b in entry["block_sizes"] for objective in entry["objectives"]]


def _normalization(entry: dict, config: dict) -> list[Request]:
    return [Request("dflash", "experiments.normalization"),  # the reference row
            *(Request("dpace", "experiments.normalization.modes", normalization=mode) for mode in entry["modes"])]


TABLES_MODULE = "dpace.report.tables"
FIGURES_MODULE = "dpace.report.figures"

# In the order of the config's experiments section (the paper's tables first, then the extensions).
EXPERIMENT_SPECS: dict[str, ExperimentSpec] = {spec.name: spec for spec in (
    ExperimentSpec("main", _main, eval_epoch=lambda config: _main_checkpoint(config)[1], times_speedup=True, artifacts=(
        Artifact("table_main", ("main",), f"{TABLES_MODULE}.main", ("metrics", "comparisons=comparisons")),
        Artifact("table_cross_model", ("cross_model", "main"), f"{TABLES_MODULE}.cross_model"),
        Artifact("table_training_time", ("main",), f"{TABLES_MODULE}.training_time", ("train_runs", "metrics=metrics")),
        Artifact("table_correlation", ("main",), f"{TABLES_MODULE}.correlation", ("blocks", "variant=reference:dflash")),
        Artifact("fig_motivation", ("main", "cross_model"), FIGURES_MODULE,
                 ("blocks", "metrics", "out", "out_png", "variant=reference:dflash")),
        Artifact("fig_weight_dynamics", ("main",), FIGURES_MODULE,
                 ("train_steps", "out", "out_png", "dpace_variant=reference:dpace", "dflash_variant=reference:dflash")),
    )),
    ExperimentSpec("cross_model", _cross_model, times_speedup=True),  # its rows are in table_cross_model, which Table 1's rows make
    ExperimentSpec("ablation", _each_objective("ablation"), every_epoch=TRAJECTORY, artifacts=(
        Artifact("table_ablation", ("ablation",), f"{TABLES_MODULE}.ablation"),
        Artifact("fig_tau_trajectory", ("ablation",), FIGURES_MODULE, ("metrics", "out", "out_png")),
    )),
    ExperimentSpec("smoothing", _smoothing, artifacts=(
        Artifact("table_smoothing", ("smoothing",), f"{TABLES_MODULE}.smoothing"),
    )),
    ExperimentSpec("block_size", _block_size, times_speedup=True, artifacts=(
        Artifact("table_block_size", ("block_size",), f"{TABLES_MODULE}.block_size"),
    )),
    ExperimentSpec("target_prob", _each_objective("target_prob"), times_speedup=True, artifacts=(
        Artifact("table_target_prob", ("target_prob",), f"{TABLES_MODULE}.averages"),
    )),
    ExperimentSpec("extras", _each_objective("extras"), artifacts=(
        Artifact("table_objectives_extra", ("extras",), f"{TABLES_MODULE}.averages"),
    )),
    ExperimentSpec("normalization", _normalization, artifacts=(
        Artifact("table_normalization", ("normalization",), f"{TABLES_MODULE}.averages"),
    )),
)}

# Every artifact, tables first; ``requires``: the experiment without which the config cannot build it.
ARTIFACTS: dict[str, Artifact] = {a.name: a for kind in ("table", "figure") for spec in EXPERIMENT_SPECS.values()
                                  for a in spec.artifacts if a.kind == kind}
REQUIRES: dict[str, str] = {a.name: spec.name for spec in EXPERIMENT_SPECS.values() for a in spec.artifacts}
TABLES = [name for name, artifact in ARTIFACTS.items() if artifact.kind == "table"]
FIGURES = [name for name, artifact in ARTIFACTS.items() if artifact.kind == "figure"]
# The suites an experiment or an artifact asks for besides the full one, by name.
EXTRA_SUITES: dict[str, Suite] = {suite.name: suite for suite in (
    *(spec.every_epoch for spec in EXPERIMENT_SPECS.values() if spec.every_epoch), BLOCKS)}
# The experiment whose drafters the reference drafters are.
REFERENCE_EXPERIMENT = "main"

def _field(drafter: Any, key: str):
    return drafter[key] if isinstance(drafter, Mapping) else getattr(drafter, key)


def reference_drafter(drafters: Iterable[Any], objective: str):
    """The drafter of ``objective`` that the figures and the correlation table draw among Table 1's
    ``drafters``: the shallowest (depth, then block size). ``drafters`` are records with objective, depth
    and block_size (``dpace.config.Variant``s, or metrics rows as dicts); the one found is returned."""
    candidates = [d for d in drafters if _field(d, "objective") == objective]
    if not candidates:
        raise ValueError(f"no {objective!r} drafter in experiment {REFERENCE_EXPERIMENT!r}")
    return min(candidates, key=lambda d: (int(_field(d, "depth")), int(_field(d, "block_size"))))

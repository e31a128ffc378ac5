"""The experiment registry: named drafter variants expanded from the config, and the checks that
a JSON schema cannot express (gamma defaults per block size, layer ranges, objective names).

A variant's id is derived from what it trains (objective, hyperparameters, depth, block size,
normalization, epochs), never from which experiment asked for it, so two experiments that need
the same drafter share one training job and one evaluation.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from dpace.data import TRAIN_SETS, mixture_name
from dpace.experiments import EXPERIMENT_SPECS, Request
from dpace.objective_records import (
    REGISTRY,
    canonical_objective,
    resolve_hparams,
    resolve_normalization,
)
from dpace.responses.conversations import dataset_name
from dpace.schema import SCHEMA, load_schema


class ConfigError(ValueError):
    """A configuration value that cannot work; the message names the key."""


@dataclass(frozen=True)
class Variant:
    target: str
    objective: str
    depth: int
    block_size: int
    hparams: tuple  # sorted (name, value) pairs after defaults are filled in
    normalization: str | None
    epochs: int
    # train.seed where it differs from the top-level seed (which also picks the prompts): a second
    # training run of the same drafter on the same answers, named apart from the first.
    training_seed: int | None = None
    # train.seeds > 1: the training_seed of this drafter's first seed, whose id names the method that
    # its seeds are averaged and compared under (tables, comparisons); the first seed keeps today's id.
    first_training_seed: int | None = None

    @property
    def id(self) -> str:
        return self._id(self.training_seed)

    @property
    def method_id(self) -> str:
        """The id of this drafter's first training seed: the same for all its seeds."""
        return self._id(self.first_training_seed)

    def _id(self, training_seed: int | None) -> str:
        parts = [self.objective]
        parts += [f"{name}{value:g}" if isinstance(value, float) else f"{name}{value}" for name, value in self.hparams]
        parts += [f"d{self.depth}", f"b{self.block_size}"]
        if self.normalization:
            parts.append(f"n{self.normalization}")
        parts.append(f"e{self.epochs}")
        if training_seed is not None:
            parts.append(f"s{training_seed}")
        return "-".join(parts)

    def seed(self, config_seed: int) -> int:
        """The seed this drafter trains with: its own, or the run's."""
        return config_seed if self.training_seed is None else self.training_seed

    def train_settings(self) -> dict:
        return {
            "objective": self.objective,
            "objective_hparams": dict(self.hparams),
            "normalization": self.normalization,
            "depth": self.depth,
            "block_size": self.block_size,
            "epochs": self.epochs,
        }


@dataclass
class Experiment:
    """One experiment's variants, and which of their epochs are evaluated on which suite."""

    name: str
    variants: list[Variant] = field(default_factory=list)
    every_epoch: bool = False  # evaluated after every epoch too (its record's every_epoch suite)
    eval_epoch: int | None = None  # the checkpoint the experiment's tables read; None: each variant's last


def _variant(config: dict, request: Request) -> Variant:
    train = config["train"]
    block_size = request.block_size or train["block_size"]
    normalization = request.normalization
    try:
        objective = canonical_objective(request.objective)
        given = dict(train.get("objective_hparams", {}).get(objective, {}))
        given.update(request.hparams or {})
        resolved = resolve_hparams(objective, block_size, **given)
        # The released code's own reduction is the default: naming it explicitly is the same drafter.
        if normalization is not None and resolve_normalization(objective, normalization) == resolve_normalization(objective, None):
            normalization = None
    except ValueError as error:
        raise ConfigError(f"{request.where}: {error}") from None
    training_seed = train["seed"]
    seed = None if training_seed is None or training_seed == config["seed"] else int(training_seed)
    return Variant(
        target=request.target or config["main_target"],
        objective=objective,
        depth=int(request.depth or train["depth"]),
        block_size=int(block_size),
        hparams=tuple(sorted(resolved.items())),
        normalization=normalization,
        epochs=int(request.epochs or train["epochs"]),
        training_seed=seed,
        first_training_seed=seed,
    )


def _seed_replicates(config: dict, variant: Variant, seeds: int) -> list[Variant]:
    """``variant`` at ``seeds`` consecutive training seeds, its own first. A seed equal to the top-level seed
    is named without a suffix, as a drafter trained with it always is."""
    if seeds == 1:
        return [variant]
    first = variant.seed(config["seed"])
    return [replace(variant, training_seed=None if first + i == config["seed"] else first + i) for i in range(seeds)]


def experiments(config: dict) -> dict[str, Experiment]:
    """Expand ``config["experiments"]`` into the variants of every experiment that is configured, each by
    its record in ``dpace.experiments.EXPERIMENT_SPECS``."""
    config = with_schema_defaults(config)
    out: dict[str, Experiment] = {}
    for name, spec in EXPERIMENT_SPECS.items():
        if name not in config["experiments"]:
            continue
        try:
            requests = spec.expand(config["experiments"][name], config)
            eval_epoch = spec.eval_epoch(config)
        except ValueError as error:
            raise ConfigError(str(error)) from None
        variants = [_variant(config, request) for request in requests]
        # train.seeds (or the experiment's own seeds): every drafter at each seed, its seeds side by side
        seeds = int(config["experiments"][name].get("seeds", config["train"]["seeds"]))
        out[name] = Experiment(name, [seeded for v in variants for seeded in _seed_replicates(config, v, seeds)],
                               every_epoch=spec.every_epoch is not None, eval_epoch=eval_epoch)
    return out


def with_schema_defaults(config: dict) -> dict:
    """A copy of ``config`` with the schema's defaults filled in: what ``validate_config`` makes of it, for
    callers that expand a config they have not validated (tests, benchmarks)."""
    filled = copy.deepcopy(config)
    _fill_defaults(filled, load_schema())
    return filled


def all_variants(config: dict) -> dict[tuple[str, str], Variant]:
    """Every distinct (target, variant id) across experiments."""
    found = {}
    for experiment in experiments(config).values():
        for variant in experiment.variants:
            found[(variant.target, variant.id)] = variant
    return found


def training_data(config: dict, target: str) -> str:
    """The data set a target's drafters train on: its imported responses (``targets.<t>.responses``)
    or ``data.train_set`` (one set, or a mixture named ``a+b``) answered by the target itself."""
    source = config["targets"][target].get("responses")
    return dataset_name(source) if source else mixture_name(config["data"]["train_set"])


def training_prompt_counts(config: dict) -> dict[str, int]:
    """How many prompts of each training set ``data.train_set`` draws, in its order."""
    sets, counts = config["data"]["train_set"], config["data"]["train_prompts"]
    sets = [sets] if isinstance(sets, str) else list(sets)
    if isinstance(counts, int):
        if len(sets) > 1:
            raise ConfigError(f"data.train_prompts: a mixture of {sets} needs a count per set, e.g. "
                              f"{{{', '.join(f'{name}: 100' for name in sets)}}}")
        return {sets[0]: counts}
    if sorted(counts) != sorted(sets):
        raise ConfigError(f"data.train_prompts: counts for {sorted(counts)}, but data.train_set is {sets}")
    return {name: counts[name] for name in sets}


def _shown_name(name: str) -> str:
    """A name for a message: whole when short, else its start and its length."""
    return repr(name) if len(name) <= 64 else f"{name[:40]!r}... ({len(name)} characters)"


def _check_names(config: dict) -> None:
    """Target and experiment names are folder names: the whole name matches the schema's pattern (JSON schema's
    ``pattern`` searches, and ``$`` matches before a trailing newline: ``tiny\\n`` passes it) and fits its
    length, checked here so that no job meets a name the file system refuses."""
    schema = load_schema()["properties"]
    for section in ("targets", "experiments"):
        rule = schema[section]["propertyNames"]
        for name in config[section]:
            if not re.fullmatch(rule["pattern"], name):
                raise ConfigError(f"{section}: {_shown_name(name)} does not match {rule['pattern']} as a whole "
                                  "(a folder name: letters, digits, '.', '_', '-')")
            if len(name) > rule["maxLength"]:
                raise ConfigError(f"{section}: {_shown_name(name)} is longer than {rule['maxLength']} characters")


def check_config(config: dict) -> None:
    """Checks beyond the schema; each failure names the key and what is allowed. Enums (benchmark names,
    train.precision, ...) are the schema's alone. Fills the schema's defaults first, as validate_config does."""
    _fill_defaults(config, load_schema())
    _check_names(config)
    if config["main_target"] not in config["targets"]:
        raise ConfigError(f"main_target: {config['main_target']!r} is not one of targets {sorted(config['targets'])}")
    counts = config["data"]["prompts_per_benchmark"]
    if isinstance(counts, dict):
        missing = [name for name in config["data"]["benchmarks"] if name not in counts]
        if missing:
            raise ConfigError(f"data.prompts_per_benchmark: no count for benchmark(s) {missing}")
    training_prompt_counts(config)
    if config["train"]["drafter_init"] != "random" and config["train"]["backend"] != "local":
        raise ConfigError(
            f"train.drafter_init: {config['train']['drafter_init']!r} needs train.backend local "
            "(SpecForge initialises its drafter at random); valid with specforge: random"
        )
    scaling = config["train"]["feature_scaling"]
    if scaling != "none":
        if config["train"]["backend"] != "local":
            raise ConfigError(f"train.feature_scaling: {scaling!r} needs train.backend local "
                              "(SpecForge feeds fc the raw features); valid with specforge: none")
        if config["features"]["mode"] != "cached":
            raise ConfigError(f"train.feature_scaling: {scaling!r} reads each feature's RMS from the cached "
                              "features; it needs features.mode: cached")
        if config["train"]["drafter_init"] == "target":
            raise ConfigError(f"train.feature_scaling: {scaling!r} cannot start from drafter_init: target, "
                              "which passes the raw deepest feature through fc")
    # Settings only this project's own loop and decoder implement; the engines would silently ignore them.
    local_only = {
        "draft_vocab_size": "SpecForge and SGLang score the whole vocabulary",
        "sliding_window": "not checked with SpecForge's trainer or SGLang's DFlash worker",
    }
    for key, why in local_only.items():
        if config["train"][key]:
            engines = [f"{stage}.backend: {config[stage]['backend']}" for stage in ("train", "eval")
                       if config[stage]["backend"] != "local"]
            if engines:
                raise ConfigError(
                    f"train.{key}: {config['train'][key]} needs the local backends ({why}), "
                    f"not {', '.join(engines)}; valid there: 0"
                )
    for name in config["train"].get("objective_hparams", {}):  # optional, no default
        if name not in REGISTRY:
            raise ConfigError(f"train.objective_hparams: unknown objective {name!r}; valid: {list(REGISTRY)}")
    features = config["features"]
    for target_name, target in config["targets"].items():
        generated = {*TRAIN_SETS, mixture_name(config["data"]["train_set"])}
        if target.get("responses") and dataset_name(target["responses"]) in generated:
            raise ConfigError(
                f"targets.{target_name}.responses: {target['responses']!r} is named like the generated set "
                f"{dataset_name(target['responses'])!r}; rename the file"
            )
        _check_heads(target_name, target)
        layers = target.get("num_layers")
        ids = target.get("target_layer_ids") or features.get("target_layer_ids")
        if layers is not None and ids is not None:
            bad = [i for i in ids if not 0 <= i < layers]
            if bad:
                raise ConfigError(
                    f"targets.{target_name}.target_layer_ids: {bad} outside the target's layers 0..{layers - 1}"
                )
    for variant in all_variants(config).values():
        if variant.target not in config["targets"]:
            raise ConfigError(f"experiments: target {variant.target!r} is not one of targets {sorted(config['targets'])}")


RANDOM_TARGET_SHAPE = {"hidden_size": 64, "num_heads": 4, "num_kv_heads": 2}  # dpace.targets._random_model's


def _check_heads(name: str, target: dict) -> None:
    """Attention shapes that split evenly: hidden_size into num_heads heads, those into num_kv_heads groups."""
    shape = {**(RANDOM_TARGET_SHAPE if target["source"] == "random" else {}), **target}
    hidden, heads, kv_heads = (shape.get(key) for key in ("hidden_size", "num_heads", "num_kv_heads"))
    if hidden is not None and heads is not None and hidden % heads:
        raise ConfigError(f"targets.{name}.hidden_size: {hidden} does not divide into num_heads {heads} heads")
    if heads is not None and kv_heads is not None and heads % kv_heads:
        raise ConfigError(f"targets.{name}.num_heads: {heads} does not divide into num_kv_heads {kv_heads} groups")


def _yaml_typed(value):
    """A --config value with every scalar read as YAML reads it ("8" -> 8, "1.0e-4" -> 0.0001)."""
    import yaml

    if isinstance(value, dict):
        return {key: _yaml_typed(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_yaml_typed(item) for item in value]
    if isinstance(value, str) and value:
        return yaml.safe_load(value)
    return value


def apply_command_line_types(config: dict, overrides: dict, *, nested: bool = False) -> None:
    """Give nested ``--config`` values (``overrides``, as Snakemake parsed them) their YAML types in
    ``config``, in place.

    Snakemake reads ``--config 'train={epochs: 8}'`` with YAML's BaseLoader, so every nested value
    arrives as a string ('8') and would fail the schema, although the same text in a config file is
    typed. Top-level values (``--config seed=3``) are typed by Snakemake already and stay as they are.
    """
    for key, value in overrides.items():
        if key not in config:
            continue
        if isinstance(value, dict) and isinstance(config[key], dict):
            apply_command_line_types(config[key], value, nested=True)
        elif isinstance(value, list) or (nested and isinstance(value, str) and config[key] == value):
            config[key] = _yaml_typed(value)




def _key_path(path) -> str:
    return ".".join(str(p) for p in path) or "<top level>"


def _fill_defaults(instance: dict, schema: dict) -> None:
    """Set every absent key that the schema gives a ``default`` (the one place defaults are written),
    also inside each entry of a mapping of named entries (targets)."""
    for key, spec in schema.get("properties", {}).items():
        if key not in instance and "default" in spec:
            instance[key] = copy.deepcopy(spec["default"])
        if isinstance(instance.get(key), dict):
            _fill_defaults(instance[key], spec)
    entries = schema.get("additionalProperties")
    if isinstance(entries, dict) and "properties" in entries:
        for key, value in instance.items():
            if key not in schema.get("properties", {}) and isinstance(value, dict):
                _fill_defaults(value, entries)


def validate_config(config: dict, schema_path: str | Path = SCHEMA) -> None:
    """Check ``config`` against the JSON schema, then the semantic checks; raise ``ConfigError``
    with one line naming the key and what is allowed. Fills the schema's defaults into ``config``
    first, so that the rules and scripts read every key without defaults of their own."""
    import jsonschema

    schema = load_schema(schema_path)
    _fill_defaults(config, schema)
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(config), key=lambda e: (len(e.absolute_path), list(map(str, e.absolute_path))))
    if errors:
        error = errors[0]
        if error.context:  # oneOf / anyOf: report the branch that fits the value's type best
            fitting = [e for e in error.context if e.validator != "type"]  # branches of the right type
            error = jsonschema.exceptions.best_match(fitting or error.context)
        where = _key_path(error.absolute_path)
        if "propertyNames" in error.schema_path:  # a name: shown whole only when short
            raise ConfigError(f"{where}: {_shown_name(error.instance)} "
                              + (f"does not match {error.validator_value!r}" if error.validator == "pattern"
                                 else f"is longer than {error.validator_value} characters"))
        if error.validator == "additionalProperties":
            allowed = sorted(error.schema.get("properties", {}))
            extra = sorted(set(error.instance) - set(allowed))
            raise ConfigError(f"{where}: unknown key(s) {extra}; allowed: {allowed}")
        message = error.message
        if error.validator == "type" and isinstance(error.instance, str) and "number" in str(error.validator_value):
            message += " (YAML reads 1e-4 as a string: write 1.0e-4)"
        raise ConfigError(f"{where}: {message}")
    check_config(config)

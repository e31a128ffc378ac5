"""Every training objective's record: its name and spellings, hyper-parameters and their defaults, default
denominator, what its loss multiplies, and how the tables and figures show it (label, rank, colour, caption).

The torch-free half of each objective: the config (variant ids, checks) and the report read it without
importing torch. Its loss half, the weight function, sits beside the loss in ``dpace.training.objectives``
(``WEIGHTS``), which also re-exports everything here. A new objective is one record here and one weight
function there (docs/objectives.md); ``dpace.fingerprint`` fingerprints each objective's record and weight
function apart, so a training job reruns only when its own objective (or the shared code) changes.
"""

from __future__ import annotations

from dataclasses import dataclass

NORMALIZATIONS: tuple[str, ...] = ("batch", "anchor", "weight", "token")

# What the weights multiply (``Objective.loss``): "ce" is CE_j = -log q_j; "target-ce" is
# C_j = -sum_x p_j(x) log q_psi(x) against the target's distribution p_j (D-PAKL); "surrogate"
# ascends S~ itself, with gradient through q (accept-rate; its weights are diagnostics only).
LOSSES: tuple[str, ...] = ("ce", "target-ce", "surrogate")

# The smoothing alpha of the D-PACE family (q~_i = (1 - alpha) q_i + alpha), as in the paper.
DEFAULT_ALPHA = 0.5

# gamma_B of the DFlash decayed CE (App. "Loss formulations"): DFlash's 16->7, 10->5,
# 8->4 and the paper's own 12->6. B counts the anchor, as DFlash's block_size does.
DFLASH_DEFAULT_GAMMA: dict[int, float] = {16: 7.0, 10: 5.0, 8: 4.0, 12: 6.0}


def canonical_objective(name: str) -> str:
    """Canonical objective name; accepts SpecForge's loss_type spellings as aliases."""
    for record in REGISTRY.values():
        if name == record.name or name in record.aliases:
            return record.name
    aliases = ", ".join(f"{alias!r} (= {record.name!r})" for record in REGISTRY.values() for alias in record.aliases)
    raise ValueError(f"unknown objective {name!r}; valid objectives: {', '.join(REGISTRY)}; aliases: {aliases}")


def default_gamma(block_size: int) -> float:
    """DFlash's decay constant gamma_B for a block size B (anchor included)."""
    if block_size not in DFLASH_DEFAULT_GAMMA:
        known = ", ".join(f"B={b} -> {g:g}" for b, g in sorted(DFLASH_DEFAULT_GAMMA.items()))
        raise ValueError(
            f"objective 'dflash' has no default gamma for block size B={block_size} "
            f"(defaults exist only for {known}); pass gamma explicitly"
        )
    return DFLASH_DEFAULT_GAMMA[block_size]


def resolve_hparams(objective: str, block_size: int, **hparams) -> dict:
    """Validate an objective's hyper-parameters and fill the defaults.

    ``None`` values mean "use the default", so a config can pass every key. Hyper-parameters
    the objective does not take are an error rather than silently ignored.
    """
    objective = canonical_objective(objective)
    defaults = REGISTRY[objective].hparams
    given = {key: value for key, value in hparams.items() if value is not None}
    unexpected = sorted(set(given) - set(defaults))
    if unexpected:
        takes = sorted(defaults) or "no hyper-parameters"
        raise ValueError(f"objective {objective!r} takes {takes}; got unexpected {unexpected}")
    resolved = {**defaults, **given}

    if "alpha" in resolved:
        alpha = resolved["alpha"]
        if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not 0.0 <= alpha <= 1.0:
            raise ValueError(f"alpha must be a number in [0, 1] for objective {objective!r}, got {alpha!r}")
        resolved["alpha"] = float(alpha)
    if "k" in resolved:
        k = resolved["k"]
        if isinstance(k, bool) or not isinstance(k, int | float) or k != int(k) or k < 1:
            raise ValueError(f"k must be an integer >= 1 for objective 'topk-prefix', got {k!r}")
        resolved["k"] = int(k)
    if "gamma" in resolved:
        gamma = resolved["gamma"]
        if gamma is None:
            gamma = default_gamma(block_size)
        if isinstance(gamma, bool) or not isinstance(gamma, int | float) or not gamma > 0:
            raise ValueError(f"gamma must be a positive number for objective 'dflash', got {gamma!r}")
        resolved["gamma"] = float(gamma)
    return resolved


def resolve_normalization(objective: str, normalization: str | None) -> str:
    """The denominator mode actually used: ``normalization`` or the released code's default."""
    objective = canonical_objective(objective)
    if normalization is None:
        return REGISTRY[objective].normalization
    if normalization not in NORMALIZATIONS:
        raise ValueError(
            f"unknown normalization={normalization!r}; valid: None (released code), {', '.join(NORMALIZATIONS)}"
        )
    return normalization


@dataclass(frozen=True)
class Objective:
    """Everything the pipeline knows about one objective but its weight function (``dpace.training.objectives.WEIGHTS``)."""

    name: str
    label: str  # table label (LaTeX); ``{k}``-style fields are filled from the hyper-parameters
    hparams: dict  # hyper-parameter defaults; None = derived (dflash's gamma from the block size)
    normalization: str  # the released code's denominator (normalization=None), one of NORMALIZATIONS
    needs_target_logits: bool = False  # the target's logits at the drafted positions
    aliases: tuple[str, ...] = ()  # other spellings (SpecForge 0.2.0's loss_type values)
    table_rank: int = 0  # row order in every table and figure legend (D-PACE last, as in the paper)
    loss: str = "ce"  # what the weights multiply, one of LOSSES
    color: str | None = None  # line colour in the figures (matplotlib); a figure refuses to draw one without
    # What sets it apart where close variants stand side by side (Table 3, Figure 3c): "DFlash (decayed-CE)".
    detail: str = ""
    # How a caption introduces it after its quoted label (LaTeX): "``Top-$k$ prefix mask'' is the hard-mask
    # baseline ...". Empty only for DFlash and D-PACE, which every caption names in its own words.
    caption: str = ""

    def __post_init__(self):
        if self.loss not in LOSSES:
            raise ValueError(f"objective {self.name!r}: loss {self.loss!r}; valid: {', '.join(LOSSES)}")
        if self.normalization not in NORMALIZATIONS:
            raise ValueError(f"objective {self.name!r}: normalization {self.normalization!r}; "
                             f"valid: {', '.join(NORMALIZATIONS)}")

    def display_label(self, **hparams) -> str:
        return self.label.format(**{**self.hparams, **{k: v for k, v in hparams.items() if v is not None}})

    def symbolic_label(self) -> str:
        """The label with its hyper-parameters as symbols (``Top-$k$ prefix mask``), for captions."""
        return self.label.format(**{name: f"${name}$" for name in self.hparams})

    def comparison_label(self) -> str:
        """The label with its ``detail``, where variants are compared side by side."""
        return f"{self.display_label()} ({self.detail})" if self.detail else self.display_label()


# Released-code reductions: DFlash-style objectives are weighted means ("weight"), the D-PACE
# family is a per-sequence sum divided by the batch size ("batch"), as in SpecForge 0.2.0.
# dpakl and accept-rate change the per-position loss as well (``loss``; ``dpace.training.objectives``).
# Colours: matplotlib's tab10, DFlash red and D-PACE blue as in the paper's figures.
REGISTRY: dict[str, Objective] = {o.name: o for o in (
    Objective("dflash", "DFlash", {"gamma": None}, "weight", table_rank=0, color="#d62728",
              detail="decayed-CE"),
    Objective("dpace", "D-PACE", {"alpha": DEFAULT_ALPHA}, "batch", table_rank=8,
              color="#1f77b4", detail="full"),
    Objective("dpace-cumulative", "cumulative-only", {"alpha": DEFAULT_ALPHA}, "batch",
              aliases=("dpace-cumulative-confidence-only",), table_rank=4, color="#2ca02c",
              caption=r"weights position $j$ by D-PACE's cumulative confidence $P_j$ alone"),
    Objective("dpace-continuation", "continuation-only", {"alpha": DEFAULT_ALPHA}, "batch",
              aliases=("dpace-continuation-value-only",), table_rank=3, color="#ff7f0e",
              caption=r"weights position $j$ by D-PACE's continuation value $\tilde f_j$ alone"),
    Objective("topk-prefix", "Top-{k} prefix mask", {"k": 3}, "weight", table_rank=1,
              color="#9467bd", caption="is the hard-mask baseline adapted from GRIFFIN"),
    Objective("accept-rate", "Accept-rate", {}, "batch", table_rank=2, loss="surrogate",
              color="#8c564b", caption=r"directly optimizes the accepted-length surrogate $\tilde S$"),
    Objective("dpace-target-prob", "D-PACE (target prob)", {"alpha": DEFAULT_ALPHA}, "batch",
              needs_target_logits=True, table_rank=5, color="#17becf",
              caption="replaces the draft probability with the target probability on the same token in the "
                      "D-PACE weight"),
    Objective("dpakl", "D-PAKL", {"alpha": DEFAULT_ALPHA}, "batch", needs_target_logits=True,
              table_rank=6, loss="target-ce", color="#e377c2", caption="is the KL-distillation variant of D-PACE"),
    Objective("pard2-cat", "PARD-2 CAT", {}, "weight", needs_target_logits=True, table_rank=7,
              color="#7f7f7f", caption="is PARD-2's confidence-adaptive token weighting"),
)}

# Views of the registry, for callers that need one fact about every objective.
OBJECTIVES: tuple[str, ...] = tuple(REGISTRY)
OBJECTIVE_ALIASES: dict[str, str] = {alias: o.name for o in REGISTRY.values() for alias in o.aliases}
NEEDS_TARGET_LOGITS: frozenset[str] = frozenset(o.name for o in REGISTRY.values() if o.needs_target_logits)
DEFAULT_NORMALIZATION: dict[str, str] = {o.name: o.normalization for o in REGISTRY.values()}


def objective_record(name: str) -> Objective:
    """The registry record of ``name`` (aliases accepted)."""
    return REGISTRY[canonical_objective(name)]

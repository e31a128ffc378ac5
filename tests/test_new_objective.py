"""A new objective is one record plus its weight function: every table and figure that lists objectives shows it.

``lindecay`` (w_j = 1 - (j-1)/B, a linear position decay) is registered in temporary copies of the registry and
of the weight functions (monkeypatch) and given runs in the hand-made metrics of experiments main, ablation and extras; Table 1,
Table 3, Figure 3c and the extras table must show its row, in its record's rank, with its record's label,
colour and caption wording. An objective a table cannot show (no record, no colour, no caption wording) is an
error that names it, never a dropped row.
"""

from __future__ import annotations

import dataclasses
import re

import pandas as pd
import pytest
import torch

from dpace import objective_records
from dpace.objective_records import Objective
from dpace.report import figures
from dpace.report.tables.ablation import table_ablation
from dpace.report.tables.averages import table_objectives_extra
from dpace.report.tables.main import table_main
from dpace.training import objectives
from dpace.training.objectives import block_loss


def lindecay_weights(hparams, confidence, valid, draft_logits, target_ids, target_logits):
    # w_j = 1 - (j-1)/B at block position j >= 1 (the anchor j=0 is never valid).
    positions = torch.arange(valid.shape[-1], device=valid.device, dtype=confidence.dtype)
    return (1 - (positions - 1).clamp(min=0) / valid.shape[-1]) * valid.to(confidence.dtype)


LINDECAY = Objective("lindecay", "Linear decay", {}, "weight", table_rank=2, color="#bcbd22",
                     caption="weights position $j$ by $1-(j-1)/B$")


@pytest.fixture
def lindecay(monkeypatch):
    monkeypatch.setitem(objective_records.REGISTRY, "lindecay", LINDECAY)
    monkeypatch.setitem(objectives.WEIGHTS, "lindecay", lindecay_weights)
    return LINDECAY


def with_runs_of(metrics: pd.DataFrame, objective: str, like: dict[str, str], tau_shift: float) -> pd.DataFrame:
    """``metrics`` plus a copy of the runs of ``like[experiment]`` in each experiment, as ``objective``'s."""
    copies = []
    for experiment, source in like.items():
        rows = metrics[(metrics["experiment"] == experiment) & (metrics["objective"] == source)].copy()
        assert not rows.empty, (experiment, source)
        rows["objective"] = objective
        rows["variant"] = rows["variant"].str.replace(source, objective, regex=False)
        rows["tau"] += tau_shift
        rows["speedup"] += tau_shift
        copies.append(rows)
    return pd.concat([metrics, *copies], ignore_index=True)


def first_cells(latex: str) -> list[str]:
    """The first non-empty label cell of each data row (Table 1 puts the depth first)."""
    cells = []
    for row in latex.splitlines():
        if row.endswith(r"\\") and re.search(r"\d\.\d\d", row) and not row.startswith(r"\multicolumn"):
            parts = [c.strip() for c in re.split(r"(?<!\\)&", row[:-2])]
            cells.append(parts[1] if parts[0].startswith(r"\multirow") or parts[0] == "" else parts[0])
    return cells


def caption_of(latex: str) -> str:
    return re.search(r"\\caption\{(.*)\}\n", latex).group(1)


def test_the_loss_of_a_registered_record(lindecay):
    generator = torch.Generator().manual_seed(0)
    draft_logits = torch.randn(2, 3, 4, 5, generator=generator, dtype=torch.float64)
    target_ids = torch.randint(0, 5, (2, 3, 4), generator=generator)
    valid = torch.ones(2, 3, 4, dtype=torch.bool)
    valid[..., 0] = False
    loss, diagnostics = block_loss("lindecay", draft_logits=draft_logits, target_ids=target_ids, valid=valid)
    ce = torch.nn.functional.cross_entropy(draft_logits.flatten(0, 2), target_ids.flatten(), reduction="none")
    weights = torch.tensor([0.0, 1.0, 0.75, 0.5], dtype=torch.float64).expand(2, 3, 4)
    assert diagnostics["normalization"] == "weight"
    assert loss.item() == pytest.approx(float((weights.flatten() * ce).sum() / weights.sum()), rel=1e-12)


def test_table_main_shows_the_new_objective_in_its_rank(lindecay, metrics):
    latex = table_main(with_runs_of(metrics, "lindecay", {"main": "topk-prefix"}, 0.05))
    # Rank 2 ties with Accept-rate; the name breaks the tie. Four blocks: T in {0, 1} x depth in {1, 2}.
    order = ["DFlash", "Top-3 prefix mask", "Accept-rate", "Linear decay", r"\textbf{D-PACE}"]
    assert first_cells(latex) == order * 4
    assert "``Linear decay'' weights position $j$ by $1-(j-1)/B$." in caption_of(latex)
    assert "``Top-$k$ prefix mask'' is the hard-mask baseline adapted from GRIFFIN" in caption_of(latex)


def test_table_ablation_and_figure_3c_show_the_new_objective(lindecay, metrics):
    frame = with_runs_of(metrics, "lindecay", {"ablation": "dpace-cumulative"}, -0.2)
    latex = table_ablation(frame)
    assert first_cells(latex) == ["DFlash (decayed-CE)", "Linear decay", "continuation-only", "cumulative-only",
                                  r"\textbf{D-PACE (full)}"]
    row = next(r for r in latex.splitlines() if r.startswith("Linear decay &"))
    assert row == r"Linear decay & 3.10 & 3.60 & 3.80 \\"  # cumulative-only's 3.30 / 3.80 / 4.00, less 0.2
    assert "``Linear decay'' weights position $j$ by $1-(j-1)/B$" in caption_of(latex)

    (ax,) = figures.tau_trajectory_figure(frame).axes
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert list(lines) == ["DFlash (decayed-CE)", "Linear decay", "continuation-only", "cumulative-only",
                           "D-PACE (full)"]
    assert list(lines["Linear decay"].get_ydata()) == pytest.approx([3.10, 3.60, 3.80])
    assert lines["Linear decay"].get_color() == "#bcbd22"


def test_table_objectives_extra_shows_the_new_objective(lindecay, metrics):
    latex = table_objectives_extra(with_runs_of(metrics, "lindecay", {"extras": "dpakl"}, 0.1))
    assert first_cells(latex) == ["DFlash", "Linear decay", "D-PAKL", "PARD-2 CAT", r"\textbf{D-PACE}"]
    caption = caption_of(latex)
    assert "``Linear decay'' weights position $j$ by $1-(j-1)/B$" in caption
    assert caption.index("Linear decay") < caption.index("D-PAKL") < caption.index("PARD-2 CAT")


SHOWS_OBJECTIVES = {
    "Table 1": (table_main, "main", "topk-prefix"),
    "Table 3": (table_ablation, "ablation", "dpace-cumulative"),
    "Figure 3c": (figures.tau_trajectory_figure, "ablation", "dpace-cumulative"),
    "extras table": (table_objectives_extra, "extras", "dpakl"),
}


@pytest.mark.parametrize("artifact", SHOWS_OBJECTIVES)
def test_an_objective_without_a_record_is_an_error_naming_it(artifact, metrics):
    render, experiment, like = SHOWS_OBJECTIVES[artifact]
    with pytest.raises(ValueError, match="objective 'mystery' has no record"):
        render(with_runs_of(metrics, "mystery", {experiment: like}, 0.0))


def test_an_objective_without_colour_or_caption_wording_is_an_error_naming_it(monkeypatch, metrics):
    frame = with_runs_of(metrics, "lindecay", {"ablation": "dpace-cumulative"}, 0.0)
    monkeypatch.setitem(objective_records.REGISTRY, "lindecay", dataclasses.replace(LINDECAY, color=None))
    with pytest.raises(ValueError, match="objective 'lindecay' has no colour"):
        figures.tau_trajectory_figure(frame)
    monkeypatch.setitem(objective_records.REGISTRY, "lindecay", dataclasses.replace(LINDECAY, caption=""))
    with pytest.raises(ValueError, match="objective 'lindecay' has no caption wording"):
        table_ablation(frame)

"""Figures rendered from the fixtures in tests/data (see test_tables.py for their design)."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.image as mpimg
import numpy as np
import pandas as pd
import pytest
from scipy import stats

from dpace.report import figures


def check_files(paths, pdf: Path, png: Path, shape: tuple[int, int]) -> None:
    assert tuple(paths) == (pdf, png)
    assert pdf.read_bytes()[:5] == b"%PDF-" and pdf.stat().st_size > 5_000
    img = mpimg.imread(png)
    assert img.shape == (*shape, 4)
    assert float(img[..., :3].std()) > 0.05  # not a blank canvas


def lines_by_label(ax) -> dict[str, object]:
    return {ln.get_label(): ln for ln in ax.get_lines()}


def test_fig_motivation(tmp_path, blocks, metrics):
    pdf, png = tmp_path / "fig" / "motivation.pdf", tmp_path / "fig" / "motivation.png"
    check_files(figures.fig_motivation(blocks, metrics, pdf, png), pdf, png, (570, 1500))

    fig = figures.motivation_figure(blocks, metrics)
    ax_a, ax_b = fig.axes
    sel = blocks[(blocks["benchmark"] == "math500") & (blocks["temperature"] == 0.0)]
    rho = stats.spearmanr(sel["surrogate"], sel["tau_block"]).statistic
    legend = [t.get_text() for t in ax_a.get_legend().get_texts()]
    assert f"bin mean (Spearman $\\rho$ = {rho:.2f})" in legend
    assert "blocks (n=20)" in legend
    # bin means: every block lands in one bin, weighted means give back the overall mean tau
    bins = figures.surrogate_bins(sel)
    assert bins["count"].sum() == 20
    assert np.isclose((bins["tau_mean"] * bins["count"]).sum() / 20, sel["tau_block"].mean())
    mean_line = next(ln for ln in ax_a.get_lines() if ln.get_label().startswith("bin mean"))
    assert np.allclose(mean_line.get_ydata(), bins["tau_mean"])
    # (b) bars: averages over the six benchmarks at T=0, final epoch; main configs first
    dflash, dpace = ax_b.containers
    assert np.allclose([p.get_height() for p in dflash], [3.00, 3.50, 2.50, 3.00])
    assert np.allclose([p.get_height() for p in dpace], [3.40, 3.90, 2.80, 3.30])
    texts = [t.get_text() for t in ax_b.texts]
    assert texts == ["+13.3%", "+11.4%", "+12.0%", "+10.0%"]
    ticks = [t.get_text() for t in ax_b.get_xticklabels()]
    assert ticks[0] == "SmolLM2-135M\n1L, B=16" and ticks[2] == "Llama-Mini\n1L, B=10"
    assert ax_b.get_ylabel() and ax_a.get_xlabel() and "tokens" in ax_a.get_ylabel()


def test_fig_weight_dynamics(tmp_path, train_steps):
    pdf, png = tmp_path / "weights.pdf", tmp_path / "weights.png"
    check_files(figures.fig_weight_dynamics(train_steps, pdf, png, window=3), pdf, png, (570, 1500))

    fig = figures.weight_dynamics_figure(train_steps, window=3)
    ax_a, ax_b = fig.axes
    lines = lines_by_label(ax_a)
    assert list(lines) == ["D-PACE, 10% of epoch 1", "D-PACE, 50% of epoch 1", "D-PACE, 90% of epoch 1",
                           "D-PACE, end of training", "DFlash (fixed decay)"]
    # 50% of epoch 1 with a 3-step window: steps 9, 10, 11 (epoch_progress 0.45, 0.50, 0.55)
    run = train_steps[(train_steps["variant"] == "main-dpace-d1") & train_steps["step"].isin([9, 10, 11])]
    w = run[["w_1", "w_2", "w_3"]].to_numpy()
    expected = (w / w.sum(axis=1, keepdims=True)).mean(axis=0)
    assert np.allclose(lines["D-PACE, 50% of epoch 1"].get_xdata(), [1, 2, 3])
    assert np.allclose(lines["D-PACE, 50% of epoch 1"].get_ydata(), expected)
    decay = np.array([1.0, round(math.exp(-1 / 7), 4), round(math.exp(-2 / 7), 4)])
    assert np.allclose(lines["DFlash (fixed decay)"].get_ydata(), decay / decay.sum())
    # end of training weights the last position more than early training does
    assert lines["D-PACE, end of training"].get_ydata()[-1] > lines["D-PACE, 10% of epoch 1"].get_ydata()[-1]
    assert "normalized" in ax_a.get_ylabel() and ax_a.get_xlabel()
    # (b) ten consecutive steps starting at 50% of epoch 1 (step 10), plus the DFlash reference
    step_labels = [ln.get_label() for ln in ax_b.get_lines()]
    assert step_labels == [f"step {s}" for s in range(10, 20)] + ["DFlash"]
    row = train_steps[(train_steps["variant"] == "main-dpace-d1") & (train_steps["step"] == 13)]
    w13 = row[["w_1", "w_2", "w_3"]].to_numpy()[0]
    assert np.allclose(lines_by_label(ax_b)["step 13"].get_ydata(), w13 / w13.sum())


def test_weight_dynamics_needs_unambiguous_variant(train_steps):
    other = train_steps[train_steps["variant"] == "main-dpace-d1"].assign(variant="main-dpace-d2")
    both = pd.concat([train_steps, other])
    with pytest.raises(ValueError, match="several dpace runs"):
        figures.weight_profiles(both)
    prof = figures.weight_profiles(both, dpace_variant="main-dpace-d2", window=3)
    assert list(prof.index) == [1, 2, 3]


def test_fig_tau_trajectory(tmp_path, metrics):
    pdf, png = tmp_path / "traj.pdf", tmp_path / "traj.png"
    check_files(figures.fig_tau_trajectory(metrics, pdf, png), pdf, png, (570, 750))

    fig = figures.tau_trajectory_figure(metrics)
    (ax,) = fig.axes
    lines = lines_by_label(ax)
    assert list(lines) == ["DFlash (decayed-CE)", "continuation-only", "cumulative-only", "D-PACE (full)"]
    assert np.allclose(lines["D-PACE (full)"].get_xdata(), [1, 2, 3])
    assert np.allclose(lines["D-PACE (full)"].get_ydata(), [3.35, 3.85, 3.95])
    assert np.allclose(lines["cumulative-only"].get_ydata(), [3.30, 3.80, 4.00])
    assert ax.get_xlabel() == "Training epoch" and "MATH-500" in ax.get_ylabel()


def test_figure_missing_experiment_raises(metrics):
    with pytest.raises(ValueError, match="'ablation'"):
        figures.tau_trajectory_figure(metrics[metrics["experiment"] != "ablation"])


def suptitle(fig) -> str:
    return fig._suptitle.get_text() if fig._suptitle is not None else ""


def test_a_figure_drawn_from_evaluations_that_skipped_requests_says_so(blocks, metrics):
    """The tables and the scorecard warn when an evaluation skipped requests past the target's context;
    the figures drawn from those evaluations do too, and only from those."""
    assert suptitle(figures.motivation_figure(blocks, metrics)) == ""
    assert suptitle(figures.tau_trajectory_figure(metrics)) == ""
    ablation_math500 = (metrics["experiment"] == "ablation") & (metrics["benchmark"] == "math500") \
        & (metrics["temperature"] == 0.0) & (metrics["objective"] == "dpace")
    skipped = metrics.assign(skipped_too_long=np.where(ablation_math500, 2, 0))
    assert suptitle(figures.tau_trajectory_figure(skipped)).startswith(
        f"WARNING: {2 * ablation_math500.sum()} request(s) past the target's context were skipped")
    # Figure 1 draws Table 1's experiments only: the ablation's skipped requests are not its points.
    assert suptitle(figures.motivation_figure(blocks, skipped)) == ""
    main = metrics["experiment"] == "main"
    assert suptitle(figures.motivation_figure(blocks, metrics.assign(skipped_too_long=np.where(main, 1, 0)))) \
        .startswith("WARNING:")

"""Table 3 (``tab:ablation-trajectory``), experiment ``ablation``: tau over training epochs per objective."""

from __future__ import annotations

import numpy as np
import pandas as pd

from dpace.experiments import MATH500_AT_T0
from dpace.report import latex
from dpace.report.metrics_frame import (
    ablation_trajectories,
    config_mask,
    distinct_configs,
    objective_record_of,
    sort_objectives,
    target_label_of,
)


def table_ablation(metrics: pd.DataFrame, *, benchmark: str = MATH500_AT_T0.benchmark, temperature: float = MATH500_AT_T0.temperature) -> str:
    """Table 3 (``tab:ablation-trajectory``): MATH-500 tau at T=0 per epoch for each objective of experiment
    ``ablation`` (the paper: DFlash, continuation-only, cumulative-only, D-PACE); best per epoch column bold."""
    traj = ablation_trajectories(metrics, benchmark=benchmark, temperature=temperature)
    epochs = sorted(traj["epoch"].astype(int).unique())
    configs = distinct_configs(traj)
    ncols = 1 + len(epochs)
    body = [r"\toprule", latex.row(["Epoch"] + [str(e) for e in epochs]), r"\midrule"]
    for ci, cfg in enumerate(configs):
        sub = traj[config_mask(traj, cfg)]
        if len(configs) > 1:
            label = latex.config_label(target_label_of(sub, cfg[0]), cfg[1], cfg[2])
            body.append(f"\\multicolumn{{{ncols}}}{{l}}{{\\emph{{{label}}}}} \\\\")
        wide = sub.pivot(index="objective", columns="epoch", values="tau")
        objs = sort_objectives(wide.index)
        values = [[wide.at[o, e] if e in wide.columns else np.nan for e in epochs] for o in objs]
        bold = [latex.best_flags([v[c] for v in values]) for c in range(len(epochs))]
        for ri, o in enumerate(objs):
            label = latex.bold_if(objective_record_of(o).comparison_label(), o == "dpace")
            body.append(latex.row([label] + [
                latex.cell(v, bold[c][ri], where=f"tab:ablation-trajectory, {', '.join(map(str, cfg))}, {o}, "
                                                 f"epoch {epochs[c]}")
                for c, v in enumerate(values[ri])]))
        body.append(r"\bottomrule" if ci == len(configs) - 1 else r"\midrule")
    depths = sorted({int(c[1]) for c in configs})
    bname = latex.BENCHMARK_LABELS.get(benchmark, latex.escape(benchmark))
    caption = (
        f"\\textbf{{Component ablation on {bname} ({'/'.join(f'{d}L' for d in depths)}).}} {bname} $\\tau$ "
        f"($T{{=}}{latex.temperature_text(temperature)}$) over training epochs for the DFlash baseline and D-PACE"
    )
    described = latex.describe_objectives(traj["objective"].unique())
    caption += f" next to: {described}" if described else "."
    return latex.table(body, spec="l" + "c" * len(epochs), caption=caption, label="tab:ablation-trajectory")

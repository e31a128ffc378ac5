"""Table 8 (``tab:correlation``), experiment ``main``'s per-block records: Spearman rho of block
confidence statistics with the emitted length."""

from __future__ import annotations

import pandas as pd

from dpace.experiments import MATH500_AT_T0
from dpace.report import latex
from dpace.report.metrics_frame import block_correlations, is_finite, select_blocks


def _pvalue_text(p: float) -> str:
    if not is_finite(p):
        return latex.MISSING
    if p < 1e-10:
        return r"$<10^{-10}$"
    if p < 1e-3:
        mant, exp = f"{p:.1e}".split("e")
        return f"${mant}\\times 10^{{{int(exp)}}}$"
    return f"${p:.3f}$"


def table_correlation(
    blocks: pd.DataFrame,
    *,
    variant: str | None = None,
    benchmark: str | None = MATH500_AT_T0.benchmark,
    temperature: float | None = MATH500_AT_T0.temperature,
    epoch: int | None = None,
) -> str:
    """Table 8 (``tab:correlation``): Spearman rho (and p) of ``sum_q`` and of the surrogate
    ``S~`` with the per-block emitted length; the larger rho bold."""
    rows = select_blocks(blocks, variant=variant, benchmark=benchmark, temperature=temperature, epoch=epoch)
    corr = block_correlations(rows)
    rhos = [corr["sum_q"][0], corr["surrogate"][0]]
    bold = latex.best_flags(rhos)
    names = [r"$\sum_i q_i$", r"$\tilde S = \sum_{k}\prod_{i\le k} q_i$"]
    body = [r"\toprule", latex.row(["Per-block statistic", r"Spearman $\rho$", "$p$"]), r"\midrule"]
    for name, col, b in zip(names, ("sum_q", "surrogate"), bold, strict=True):
        rho, p = corr[col]
        body.append(latex.row([name, latex.cell(rho, b, math_mode=True), _pvalue_text(p)]))
    body.append(r"\bottomrule")
    n_prompts = rows["prompt_index"].nunique() if "prompt_index" in rows.columns else None
    where = f" on {n_prompts} {latex.BENCHMARK_LABELS.get(benchmark, latex.escape(benchmark))} prompts" if (
        n_prompts and benchmark) else ""
    caption = (
        r"Per-block Spearman rank correlation between reported $\tau_b$ and two block-level confidence "
        f"statistics over {len(rows)} blocks{where} (variant {latex.escape(rows['variant'].iloc[0])}). "
        r"$\sum_i q_i$ sums per-position draft confidence, while $\tilde S=\sum_{k=1}^{B}\prod_{i\le k}q_i$ "
        r"sums cumulative prefix-confidence terms."
    )
    return latex.table(body, spec="lcc", caption=caption, label="tab:correlation", placement="h")

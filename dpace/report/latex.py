"""LaTeX for the paper's tables: number formatting, cells, rows, the ``table`` environment, and the
labels and caption wording of benchmarks and objectives (read from each objective's registry record).

Pure string building on values the table modules (``dpace.report.tables``) have selected; nothing here
selects rows (``dpace.report.metrics_frame`` does).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import pandas as pd

from dpace.report.metrics_frame import is_finite, objective_record_of, sort_objectives

BENCHMARK_LABELS: dict[str, str] = {
    "gsm8k": "GSM8K",
    "math500": "MATH-500",
    "humaneval": "HumanEval",
    "mbpp": "MBPP",
    "mt_bench": "MT-Bench",
    "alpaca": "Alpaca",
}
BENCHMARK_CATEGORIES: dict[str, str] = {
    "gsm8k": "Math",
    "math500": "Math",
    "humaneval": "Code",
    "mbpp": "Code",
    "mt_bench": "Chat",
    "alpaca": "Chat",
}
# Row order, labels and caption wording come from each objective's record (dpace.objective_records.REGISTRY), read
# when a table is rendered; which objectives a table shows comes from its experiment's rows (its config).
# DFlash and D-PACE are the baseline and the method: captions name them in their own words.
NAMED_IN_CAPTIONS: tuple[str, ...] = ("dflash", "dpace")

MISSING = "--"  # only for values a complete row leaves undefined (a p-value of a constant, a change from 0)


class MissingCell(ValueError):
    """A table cell whose metrics row is absent: the table fails naming it instead of printing ``--``."""


def require(x: object, where: str) -> object:
    """``x`` when it is a number; else ``MissingCell`` naming the cell."""
    if not is_finite(x):
        raise MissingCell(f"{where}: no value (its metrics row is missing: an evaluation that did not run or "
                          "whose summary lacks it); rerun that evaluation")
    return x


def fmt(x: object, digits: int = 2) -> str:
    """``x`` with ``digits`` decimals, or ``--`` for missing / non-finite values."""
    return f"{float(x):.{digits}f}" if is_finite(x) else MISSING  # type: ignore[arg-type]


def cell(x: object, bold: bool = False, *, math_mode: bool = False, digits: int = 2, where: str | None = None) -> str:
    """One number of a table; with ``where`` (the cell's name) a missing one fails instead of printing ``--``."""
    if where is not None:
        require(x, where)
    s = fmt(x, digits)
    if s == MISSING:
        return s
    if math_mode:
        return f"$\\mathbf{{{s}}}$" if bold else f"${s}$"
    return f"\\textbf{{{s}}}" if bold else s


def best_flags(values: Sequence[object], digits: int = 2, *, higher: bool = True) -> list[bool]:
    """Which entries are best at the displayed precision (all ties); none if < 2 candidates."""
    rounded = [round(float(v), digits) if is_finite(v) else None for v in values]  # type: ignore[arg-type]
    finite = [v for v in rounded if v is not None]
    if len(finite) < 2:
        return [False] * len(values)
    target = max(finite) if higher else min(finite)
    return [v is not None and v == target for v in rounded]


# Each of LaTeX's ten special characters as text: one pass over the characters, so that the braces of
# \textbackslash{} are never escaped again (\textbackslash\{\} printed a backslash and "{}"), and ~ (a
# non-breaking space) and ^ (an error outside math) print as themselves.
LATEX_SPECIALS = {
    "\\": r"\textbackslash{}", "{": r"\{", "}": r"\}", "$": r"\$", "&": r"\&", "#": r"\#",
    "^": r"\textasciicircum{}", "_": r"\_", "%": r"\%", "~": r"\textasciitilde{}",
}


def escape(text: object) -> str:
    """Free text (a target label, a benchmark or variant name) as LaTeX that prints it as written."""
    return "".join(LATEX_SPECIALS.get(ch, ch) for ch in str(text))


def num_text(x: float) -> str:
    """Compact number for captions/headers: 0.0, 0.5, 0.25, 1."""
    return f"{x:.1f}" if round(x, 1) == x else f"{x:g}"


def temperature_text(t: float) -> str:
    return f"{t:g}"


def row(cells: Iterable[str]) -> str:
    return " & ".join(cells) + r" \\"


def objective_label(objective: str, k: object = None) -> str:
    """Display name of an objective (``k`` names the top-k of the prefix-mask baseline)."""
    record = objective_record_of(objective)
    return record.display_label(k=int(float(k)) if is_finite(k) else None)  # type: ignore[arg-type]


def describe_objectives(objectives: Iterable[str]) -> str:
    """Caption sentences introducing each shown objective in row order, from its record:
    "``Top-$k$ prefix mask'' is the hard-mask baseline adapted from GRIFFIN; ...". DFlash and D-PACE
    are left to the caption; any other objective without caption wording is an error naming it."""
    parts = []
    for objective in sort_objectives(objectives):
        if objective in NAMED_IN_CAPTIONS:
            continue
        record = objective_record_of(objective)
        if not record.caption:
            raise ValueError(f"objective {objective!r} has no caption wording in its record "
                             "(dpace.objective_records.REGISTRY, field caption): no caption can introduce it")
        parts.append(f"``{record.symbolic_label()}'' {record.caption}")
    return "; ".join(parts) + "." if parts else ""


def benchmark_label(benchmark: str) -> str:
    return BENCHMARK_LABELS.get(benchmark, escape(benchmark))


def bold_if(label: str, condition: bool) -> str:
    return f"\\textbf{{{label}}}" if condition else label


def table(
    body: Sequence[str],
    *,
    spec: str,
    caption: str,
    label: str,
    size: str = r"\small",
    tabcolsep: str | None = None,
    resize: bool = False,
    placement: str = "t",
) -> str:
    lines = [f"\\begin{{table}}[{placement}]", r"\centering", f"\\caption{{{caption}}}", f"\\label{{{label}}}"]
    lines.append(size)
    if tabcolsep:
        lines.append(f"\\setlength{{\\tabcolsep}}{{{tabcolsep}}}")
    if resize:
        lines.append(r"\resizebox{\linewidth}{!}{%")
    lines.append(f"\\begin{{tabular}}{{{spec}}}")
    lines.extend(body)
    lines.append(r"\end{tabular}")
    if resize:
        lines.append("}")
    lines.append(r"\end{table}")
    return "\n".join(lines) + "\n"


def config_label(target_label: object, depth: object, block_size: object) -> str:
    return f"{escape(target_label)}, {int(depth)}L, $B{{=}}{int(block_size)}$"


def epoch_phrase(df: pd.DataFrame) -> str:
    epochs = sorted(df["epoch"].dropna().unique())
    return f"epoch~{int(epochs[0])}" if len(epochs) == 1 else "the final epoch"


def join_words(items: Sequence[str]) -> str:
    items = list(items)
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]

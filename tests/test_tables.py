"""LaTeX tables rendered from the hand-made fixtures in tests/data.

Fixture design (tests/data/metrics.csv, one final epoch = 2 unless stated):

* main, SmolLM2-135M, B=16: tau = base + 0.5 (depth - 1) - 0.25 T + offset(benchmark) with
  base DFlash 3.00 / Top-3 2.90 / D-PACE 3.40, offsets averaging to 0, SR = tau - 1; Accept-rate is
  constant (tau 1.03 at 1L, 1.04 at 2L, SR 0.77).  Exception: DFlash 1L T=1 MT-Bench tau +1.0 (DFlash
  wins that cell).  Epoch-1 D-PACE 1L T=0 rows hold 9.99 and must never show.
* cross_model: Llama-Mini (B=10) and Qwen-Mini (B=16); Qwen-Mini Alpaca SR favours DFlash.
* ablation: MATH-500 tau over epochs 1..3; cumulative-only wins epoch 3.
* smoothing / block_size / target_prob / extras / normalization: constant tau per run (averages are
  the constants); the runs they share with main / block_size are borrowed.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest
from scipy import stats

from dpace.report.tables.ablation import table_ablation
from dpace.report.tables.averages import table_normalization, table_objectives_extra, table_target_prob
from dpace.report.tables.block_size import table_block_size
from dpace.report.tables.correlation import table_correlation
from dpace.report.tables.cross_model import table_cross_model
from dpace.report.tables.main import SIGNIFICANT, table_main
from dpace.report.tables.smoothing import table_smoothing
from dpace.report.tables.training_time import table_training_time

NUMBER = re.compile(r"\d\.\d\d|--|~ms|\d:\d\d")





# ---------------------------------------------------------------- parsing helpers


def split_cells(row: str) -> list[str]:
    assert row.endswith(r"\\"), row
    return [c.strip() for c in re.split(r"(?<!\\)&", row[: -2])]


def width(row: str) -> int:
    total = 0
    for cell in split_cells(row):
        m = re.match(r"\\multicolumn\{(\d+)\}", cell)
        total += int(m.group(1)) if m else 1
    return total


def parse(latex: str) -> tuple[int, list[str], list[str]]:
    """(column count of the tabular spec, all body lines, data rows)."""
    spec = re.search(r"\\begin\{tabular\}\{([^}]*)\}", latex).group(1)
    ncols = len(re.findall(r"[lcr]", spec))
    body = latex.split(r"\begin{tabular}{" + spec + "}", 1)[1].split(r"\end{tabular}", 1)[0]
    lines = [ln.strip() for ln in body.strip().splitlines() if ln.strip()]
    rows = [ln for ln in lines if ln.endswith(r"\\")]
    data = [r for r in rows if NUMBER.search(r) and not r.startswith(r"\multicolumn")]
    return ncols, lines, data


def check_structure(latex: str, n_data: int, n_cols: int, label: str) -> list[str]:
    ncols, lines, data = parse(latex)
    assert ncols == n_cols
    assert lines[0] == r"\toprule" and lines[-1] == r"\bottomrule"
    assert r"\midrule" in lines
    assert latex.startswith(r"\begin{table}") and latex.rstrip().endswith(r"\end{table}")
    assert f"\\label{{{label}}}" in latex and r"\caption{" in latex
    for row in (ln for ln in lines if ln.endswith(r"\\")):
        assert width(row) == ncols, row
    assert len(data) == n_data
    return [split_cells(r) for r in data]


def is_bold(cell: str) -> bool:
    return r"\textbf{" in cell or r"\mathbf{" in cell


# ---------------------------------------------------------------- Table 1


def test_table_main(metrics):
    latex = table_main(metrics)
    rows = check_structure(latex, n_data=16, n_cols=16, label="tab:main")
    assert latex.count(r"\multirow{4}{*}{1L}") == 2 and latex.count(r"\multirow{4}{*}{2L}") == 2
    assert r"\emph{Temperature} $T = 0$" in latex and r"\emph{Temperature} $T = 1$" in latex
    assert "9.99" not in latex  # epoch 1 is not the final epoch
    names = [r[1] for r in rows[:4]]
    assert names == ["DFlash", "Top-3 prefix mask", "Accept-rate", r"\textbf{D-PACE}"]
    # T=0, 1L: D-PACE best everywhere -> every number bold, DFlash none
    t0_dflash, t0_dpace = rows[0], rows[3]
    assert t0_dflash[2:] == ["2.40", "3.40", "2.80", "3.80", "2.40", "3.40", "2.20", "3.20",
                             "1.40", "2.40", "0.80", "1.80", "2.00", "3.00"]
    assert t0_dpace[2:4] == [r"\textbf{2.80}", r"\textbf{3.80}"]
    assert t0_dpace[-2:] == [r"\textbf{2.40}", r"\textbf{3.40}"]
    assert all(is_bold(c) for c in t0_dpace[2:])
    assert not any(is_bold(c) for r in rows[:3] for c in r[2:])
    # T=1, 1L MT-Bench (columns 10, 11): DFlash wins this cell only
    t1_dflash, t1_dpace = rows[8], rows[11]
    assert t1_dflash[10:12] == [r"\textbf{2.15}", r"\textbf{3.15}"]
    assert t1_dpace[10:12] == ["1.55", "2.55"]
    assert t1_dflash[-2:] == ["1.92", "2.92"]  # averages include the MT-Bench bump: 2.75 + 1/6
    assert t1_dpace[-2:] == [r"\textbf{2.15}", r"\textbf{3.15}"]
    # 2L, T=0 accept-rate row
    assert rows[6][2:4] == ["0.77", "1.04"]


def test_table_main_shows_the_mean_over_training_seeds(metrics, tmp_path):
    """train.seeds: 3 seeds per drafter, tau and SR spread by -0.3/+0.1/+0.2 around the fixture; the
    metrics CSV keeps every seed, Table 1 (through render_artifact) shows their means."""
    seeds = []
    for index, shift in enumerate((-0.3, 0.1, 0.2)):
        seed = metrics.assign(method=metrics["variant"], training_seed=index, tau=metrics["tau"] + shift,
                              speedup=metrics["speedup"] + shift)
        seeds.append(seed.assign(variant=seed["variant"] + (f"-s{index}" if index else "")))
    path = tmp_path / "main.csv"
    pd.concat(seeds).to_csv(path, index=False)
    from dpace.report.render import render_artifact

    render_artifact("table_main", metrics=[path], out=tmp_path / "table_main.tex")
    latex = (tmp_path / "table_main.tex").read_text()
    single = table_main(metrics)
    assert parse(latex)[2] == parse(single)[2]  # every number, and which are bold
    assert "mean over 3 training seeds" in latex and "training seeds" not in single


def write_summaries(metrics: pd.DataFrame, folder) -> tuple[list[dict], list[str]]:
    """Table 1's fixture rows as the evaluation summaries they came from (one summary.json per drafter and
    epoch, as dpace.evaluation writes them): the variants' metadata and the summaries' paths."""
    from dpace.io import atomic_write_text, record_checksums
    from dpace.paths import EVAL_SUMMARY

    main = metrics[metrics["experiment"] == "main"]
    variants, paths = [], []
    for (variant, epoch), rows in main.groupby(["variant", "epoch"]):
        first = rows.iloc[0]
        if not any(v["variant"] == variant for v in variants):
            variants.append({"target": first["target"], "target_label": first["target_label"], "variant": variant,
                             "experiment": "main", "objective": first["objective"], "depth": int(first["depth"]),
                             "block_size": int(first["block_size"])})
        path = folder / EVAL_SUMMARY.format(target=first["target"], variant=variant, epoch=epoch, suite="full")
        path.parent.mkdir(parents=True)
        entries = rows[["benchmark", "temperature", "tau", "speedup", "num_prompts", "num_output_tokens"]]
        atomic_write_text(path, json.dumps(entries.assign(skipped_too_long=0).to_dict("records")))
        record_checksums(path)  # as the evaluation does
        paths.append(str(path))
    return variants, paths


def test_requests_skipped_past_the_context_reach_the_metrics_csv_and_the_table(metrics, tmp_path):
    """An evaluation that skipped 2 requests too long for the target's context (its summary's
    skipped_too_long): the metrics CSV carries the count, and Table 1 drawn from it says in a LaTeX comment
    which cell's tau and SR come from fewer requests than planned; with no request skipped it says nothing."""
    from dpace.io import record_checksums
    from dpace.report.collect import write_experiment_metrics
    from dpace.report.render import render_artifact

    variants, paths = write_summaries(metrics, tmp_path / "results")
    csv, table = tmp_path / "main.csv", tmp_path / "table_main.tex"
    write_experiment_metrics(variants, paths, metrics_csv=csv, blocks_csv=tmp_path / "blocks.csv")
    render_artifact("table_main", metrics=[csv], out=table)
    assert "WARNING" not in table.read_text() and parse(table.read_text())[2] == parse(table_main(metrics))[2]

    summary = next(p for p in paths if "/main-dpace-d1/epoch-2/" in p)
    entries = json.loads(Path(summary).read_text())
    entries[1]["skipped_too_long"] = 2
    Path(summary).write_text(json.dumps(entries))
    record_checksums(summary)  # an evaluation that ran again
    write_experiment_metrics(variants, paths, metrics_csv=csv, blocks_csv=tmp_path / "blocks.csv")
    collected = pd.read_csv(csv)
    assert collected["skipped_too_long"].sum() == 2
    skipped = collected[collected["skipped_too_long"] > 0].iloc[0]
    assert (skipped["variant"], skipped["benchmark"], skipped["temperature"]) == (
        "main-dpace-d1", entries[1]["benchmark"], entries[1]["temperature"])
    render_artifact("table_main", metrics=[csv], out=table)
    first_line = table.read_text().splitlines()[0]
    assert first_line.startswith("% WARNING: 2 request(s) past the target's context were skipped")
    assert f"main-dpace-d1 epoch 2 {entries[1]['benchmark']} T={entries[1]['temperature']:g}: 2" in first_line
    assert parse(table.read_text())[2] == parse(table_main(metrics))[2]  # the numbers are the table's own


def test_table_main_marks_only_significant_average_differences(metrics):
    comparisons = pd.DataFrame([
        # significant: T=0, 1L D-PACE tau and Accept-rate SR; not significant: T=1 D-PACE tau
        {"experiment": "main", "epoch": 2, "benchmark": "avg", "objective": "dpace", "depth": 1, "temperature": 0.0,
         "metric": "tau", "significant": True},
        {"experiment": "main", "epoch": 2, "benchmark": "avg", "objective": "accept-rate", "depth": 2, "temperature": 0.0,
         "metric": "speedup", "significant": True},
        {"experiment": "main", "epoch": 2, "benchmark": "avg", "objective": "dpace", "depth": 1, "temperature": 1.0,
         "metric": "tau", "significant": False},
        # other epochs, experiments and per-benchmark rows never mark Table 1's averages
        {"experiment": "main", "epoch": 1, "benchmark": "avg", "objective": "topk-prefix", "depth": 1, "temperature": 0.0,
         "metric": "tau", "significant": True},
        {"experiment": "extras", "epoch": 2, "benchmark": "avg", "objective": "topk-prefix", "depth": 1,
         "temperature": 0.0, "metric": "tau", "significant": True},
        {"experiment": "main", "epoch": 2, "benchmark": "gsm8k", "objective": "topk-prefix", "depth": 1,
         "temperature": 0.0, "metric": "tau", "significant": True},
    ])
    plain = check_structure(table_main(metrics), n_data=16, n_cols=16, label="tab:main")
    marked_latex = table_main(metrics, comparisons=comparisons)
    marked = check_structure(marked_latex, n_data=16, n_cols=16, label="tab:main")
    dagger = SIGNIFICANT
    changed = {(i, j) for i, (a, b) in enumerate(zip(plain, marked, strict=True)) for j in range(len(a)) if a[j] != b[j]}
    assert changed == {(3, 15), (6, 14)}  # T=0 1L D-PACE avg tau; T=0 2L Accept-rate avg SR
    assert marked[3][15] == plain[3][15] + dagger and marked[6][14] == plain[6][14] + dagger
    assert "paired bootstrap" in marked_latex and "paired bootstrap" not in table_main(metrics)


def test_table_main_missing_benchmark_fails_naming_the_cell(metrics):
    """Issue 50: a missing metrics row rendered as ``-- & --``; now the table names the cell."""
    drop = (metrics["variant"] == "main-dflash-d1") & (metrics["temperature"] == 0) & (metrics["benchmark"] == "alpaca")
    with pytest.raises(ValueError, match=r"Table 1 \(tab:main\), T=0, 1L, dflash, alpaca SR: no value"):
        table_main(metrics[~drop])


def test_table_main_duplicate_runs_raise(metrics):
    dup = metrics[metrics["variant"] == "main-dflash-d1"].assign(variant="main-dflash-d1-bis")
    with pytest.raises(ValueError, match="several rows"):
        table_main(pd.concat([metrics, dup]))


# ---------------------------------------------------------------- Table 2


def test_table_cross_model(metrics):
    latex = table_cross_model(metrics)
    rows = check_structure(latex, n_data=4, n_cols=8, label="tab:cross-model")
    assert r"\multirow{2}{*}{Llama-Mini}" in rows[0][0] and r"\multirow{2}{*}{Qwen-Mini}" in rows[2][0]
    assert rows[0][1:3] == ["DFlash", "1.80 / 2.60"]
    assert rows[1][1:3] == [r"\textbf{D-PACE}", r"\textbf{2.10 / 2.90}"]
    # Qwen-Mini Alpaca: DFlash has the better SR, D-PACE the better tau
    assert rows[2][-1] == r"\textbf{2.10} / 2.50"
    assert rows[3][-1] == r"2.00 / \textbf{2.80}"
    assert "SmolLM2" not in latex


def test_table_cross_model_single_target_fallback(metrics):
    latex = table_cross_model(metrics[metrics["experiment"] != "cross_model"])
    rows = check_structure(latex, n_data=2, n_cols=8, label="tab:cross-model")
    assert "SmolLM2-135M" in rows[0][0]
    assert rows[0][2] == "2.40 / 3.40" and rows[1][2] == r"\textbf{2.80 / 3.80}"  # main 1L, GSM8K


# ---------------------------------------------------------------- Table 3


def test_table_ablation(metrics):
    latex = table_ablation(metrics)
    rows = check_structure(latex, n_data=4, n_cols=4, label="tab:ablation-trajectory")
    assert [r[0] for r in rows] == ["DFlash (decayed-CE)", "continuation-only", "cumulative-only",
                                    r"\textbf{D-PACE (full)}"]
    assert rows[0][1:] == ["3.00", "3.40", "3.60"]
    assert rows[2][1:] == ["3.30", "3.80", r"\textbf{4.00}"]
    assert rows[3][1:] == [r"\textbf{3.35}", r"\textbf{3.85}", "3.95"]
    assert "9.00" not in latex  # GSM8K row ignored
    assert "Epoch & 1 & 2 & 3" in latex


# ---------------------------------------------------------------- Table 5


def test_table_smoothing(metrics):
    latex = table_smoothing(metrics)
    rows = check_structure(latex, n_data=2, n_cols=5, label="tab:smoothing-sweep")
    assert r"& $0.0$ & $\mathbf{0.5}$ & $0.9$ & decayed-CE \\" in latex
    b8, b16 = rows
    assert b8[0] == r"SmolLM2-135M ($B{=}8$)"
    # alpha 0.5 and DFlash for B=8 come from the block_size experiment, for B=16 from main
    assert b8[1:] == ["$1.02$", "$3.10$", r"$\mathbf{3.15}$", "$2.90$"]
    assert b16[1:] == ["$1.02$", r"$\mathbf{3.40}$", "$3.20$", "$3.00$"]


# ---------------------------------------------------------------- Table 4


def test_table_block_size(metrics):
    latex = table_block_size(metrics)
    rows = check_structure(latex, n_data=3, n_cols=7, label="tab:block-size")
    assert [r[0] for r in rows] == ["4", "8", "16"]
    assert rows[0][1:] == [r"\textbf{1.50}", "2.50", "1.45", r"\textbf{2.60}", "$-3.3$", "$+4.0$"]
    assert rows[1][1:] == ["1.90", "2.90", r"\textbf{2.10}", r"\textbf{3.10}", "$+10.5$", "$+6.9$"]
    assert rows[2][1:] == ["2.00", "3.00", r"\textbf{2.40}", r"\textbf{3.40}", "$+20.0$", "$+13.3$"]  # from main


# ---------------------------------------------------------------- Table 6


def test_table_target_prob(metrics):
    latex = table_target_prob(metrics)
    rows = check_structure(latex, n_data=3, n_cols=3, label="tab:target")
    assert rows == [
        ["DFlash (decayed-CE)", "2.00", "3.00"],
        ["D-PACE (target prob)", "2.20", "3.20"],
        [r"\textbf{D-PACE (draft prob)}", r"\textbf{2.40}", r"\textbf{3.40}"],
    ]


# ---------------------------------------------------------------- Table 7


def test_table_training_time(train_runs, metrics):
    with pytest.raises(ValueError, match="several DFlash / D-PACE runs"):
        table_training_time(train_runs)
    latex = table_training_time(train_runs, metrics=metrics)
    rows = check_structure(latex, n_data=2, n_cols=4, label="tab:training-time")
    # per iteration = one micro-batch (the paper's 173 ms), per optimizer step = 2 micro-batches
    assert rows == [["DFlash (decayed-CE)", "2:24:09", "173~ms", "346~ms"],
                    [r"\textbf{D-PACE}", "2:27:29", "177~ms", "354~ms"]]
    assert "per iteration & per optimizer step" in latex
    assert "49{,}993 iterations per epoch" in latex and "an optimizer step is 2 iterations" in latex
    assert r"$+2.3\%$" in latex and "1L draft ($B{=}16$)" in latex
    rows = check_structure(
        table_training_time(train_runs, variants=["main-dflash-d2", "main-dpace-d2"]),
        n_data=2, n_cols=4, label="tab:training-time",
    )
    assert rows[0][1:] == ["3:20:48", "241~ms", "482~ms"] and rows[1][1:] == ["3:26:38", "248~ms", "496~ms"]
    without = train_runs.drop(columns=["grad_accumulation", "iterations_per_epoch"])
    rows = check_structure(table_training_time(without, metrics=metrics), n_data=2, n_cols=4,
                           label="tab:training-time")
    assert rows[0][2:] == ["--", "346~ms"]  # no accumulation recorded: per iteration unknown, not guessed


# ---------------------------------------------------------------- Table 8


def test_table_correlation(blocks):
    latex = table_correlation(blocks)
    rows = check_structure(latex, n_data=2, n_cols=3, label="tab:correlation")
    sel = blocks[(blocks["benchmark"] == "math500") & (blocks["temperature"] == 0.0)]
    assert len(sel) == 20
    rho_q = stats.spearmanr(sel["sum_q"], sel["tau_block"]).statistic
    rho_s = stats.spearmanr(sel["surrogate"], sel["tau_block"]).statistic
    assert rho_s > rho_q
    assert rows[0][1] == f"${rho_q:.2f}$"
    assert rows[1][1] == f"$\\mathbf{{{rho_s:.2f}}}$"
    assert not is_bold(rows[0][1])
    assert rows[1][2] == r"$<10^{-10}$" and rows[0][2].startswith("$") and r"\times 10^{" in rows[0][2]
    assert "20 blocks on 4 MATH-500 prompts" in latex


def test_table_correlation_needs_one_variant(blocks):
    two = pd.concat([blocks, blocks.assign(variant="other")])
    with pytest.raises(ValueError, match="several variants"):
        table_correlation(two)
    assert "other" in table_correlation(two, variant="other")


def test_table_correlation_uses_latest_epoch(blocks):
    early = blocks.assign(epoch=1, tau_block=blocks["tau_block"].iloc[::-1].to_numpy())
    latex = table_correlation(pd.concat([early, blocks.assign(epoch=2)]))
    sel = blocks[(blocks["benchmark"] == "math500") & (blocks["temperature"] == 0.0)]
    rho_s = stats.spearmanr(sel["surrogate"], sel["tau_block"]).statistic
    assert f"$\\mathbf{{{rho_s:.2f}}}$" in latex and "20 blocks" in latex


# ---------------------------------------------------------------- extension tables


def test_table_objectives_extra(metrics):
    latex = table_objectives_extra(metrics)
    rows = check_structure(latex, n_data=4, n_cols=5, label="tab:objectives-extra")
    assert r"\multicolumn{2}{c}{$T = 0$}" in latex and r"\multicolumn{2}{c}{$T = 1$}" in latex
    assert rows[0] == ["DFlash", "2.00", "3.00", "1.92", "2.92"]  # borrowed from main (1L, B=16)
    assert rows[1] == ["D-PAKL", r"\textbf{2.50}", r"\textbf{3.50}", r"\textbf{2.20}", r"\textbf{3.20}"]
    assert rows[2] == ["PARD-2 CAT", "2.10", "3.10", "1.90", "2.90"]
    assert rows[3] == [r"\textbf{D-PACE}", "2.40", "3.40", "2.15", "3.15"]


def test_table_normalization(metrics):
    latex = table_normalization(metrics)
    rows = check_structure(latex, n_data=5, n_cols=3, label="tab:normalization")
    assert [r[0] for r in rows] == ["DFlash (decayed-CE)", "D-PACE (batch)", "D-PACE (anchor)",
                                    "D-PACE (weight)", "D-PACE (token)"]
    assert rows[2][1:] == [r"\textbf{2.45}", r"\textbf{3.45}"]
    assert rows[1][1:] == ["2.30", "3.30"] and rows[0][1:] == ["2.00", "3.00"]


def test_an_untimed_experiment_prints_sr_as_not_timed_and_still_requires_every_tau(metrics):
    """Only experiments a claim reads SR of have timing jobs: the others' tables say SR was not timed (a smoke
    `all` failed on table_normalization's first SR cell), while a missing tau still fails naming its cell."""
    from dpace.report.latex import MissingCell

    untimed = metrics.assign(speedup=float("nan"))
    rows = check_structure(table_normalization(untimed), n_data=5, n_cols=3, label="tab:normalization")
    assert rows[1][1:] == ["--", "3.30"] and rows[2][1:] == ["--", r"\textbf{3.45}"]
    assert "SR: not timed for this table" in table_normalization(untimed)
    assert "not timed" not in table_normalization(metrics)
    batch = untimed.index[(untimed["experiment"] == "normalization") & (untimed["normalization"] == "batch")]
    one_tau_missing = untimed.copy()
    one_tau_missing.loc[batch[0], "tau"] = float("nan")
    with pytest.raises(MissingCell, match="tab:normalization"):
        table_normalization(one_tau_missing)
    timed_but_one_sr_missing = metrics.copy()
    first = timed_but_one_sr_missing.index[timed_but_one_sr_missing["experiment"] == "normalization"][0]
    timed_but_one_sr_missing.loc[first, "speedup"] = float("nan")
    with pytest.raises(MissingCell, match="SR"):
        table_normalization(timed_but_one_sr_missing)


# ---------------------------------------------------------------- missing experiments


@pytest.mark.parametrize(
    ("func", "experiment", "drop"),
    [
        (table_main, "main", ["main"]),
        (table_cross_model, "cross_model", ["cross_model", "main"]),
        (table_ablation, "ablation", ["ablation"]),
        (table_smoothing, "smoothing", ["smoothing"]),
        (table_block_size, "block_size", ["block_size"]),
        (table_target_prob, "target_prob", ["target_prob"]),
        (table_objectives_extra, "extras", ["extras"]),
        (table_normalization, "normalization", ["normalization"]),
    ],
)
def test_missing_experiment_raises(metrics, func, experiment, drop):
    with pytest.raises(ValueError, match=f"'{experiment}'"):
        func(metrics[~metrics["experiment"].isin(drop)])


def test_missing_column_raises(metrics):
    with pytest.raises(ValueError, match="speedup"):
        table_main(metrics.drop(columns="speedup"))


# Every LaTeX special character, each next to letters, and the text LaTeX needs to print it as written.
SPECIAL_LABEL = "a\\b{c}d$e&f#g^h_i%j~k"
SPECIAL_ESCAPED = (r"a\textbackslash{}b\{c\}d\$e\&f\#g\textasciicircum{}h\_i\%j\textasciitilde{}k")


def test_latex_escape_turns_every_special_character_into_text():
    """``\\`` used to become ``\\textbackslash\\{\\}`` (its own braces escaped again: a backslash and "{}" printed),
    and ``~`` (a non-breaking space) and ``^`` (an error outside math mode) went through."""
    from dpace.report.latex import LATEX_SPECIALS, escape

    assert escape(SPECIAL_LABEL) == SPECIAL_ESCAPED
    assert set(LATEX_SPECIALS) == set("\\{}$&#^_%~")
    for ch, text in LATEX_SPECIALS.items():
        assert escape(ch) == text and escape(f"x{ch}y") == f"x{text}y"
    assert escape("Qwen3-8B (plain) 1.5") == "Qwen3-8B (plain) 1.5"  # nothing else changes
    # A second round escapes the first's output as text (one pass, character by character): what it prints is
    # the once-escaped string, never a mix of escaped and raw specials.
    twice = escape(SPECIAL_ESCAPED)
    assert twice == "".join(LATEX_SPECIALS.get(ch, ch) for ch in SPECIAL_ESCAPED)
    assert twice.startswith(r"a\textbackslash{}textbackslash\{\}b\textbackslash{}\{c")


def test_a_target_label_with_every_special_character_reaches_the_table_escaped(metrics):
    relabelled = metrics.assign(target_label=SPECIAL_LABEL)
    latex = table_main(relabelled)
    assert SPECIAL_ESCAPED in latex
    assert r"\textbackslash\{\}" not in latex and "~k" not in latex and "^h" not in latex

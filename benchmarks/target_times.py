"""How long each Snakemake target took: the summed wall time of every job it needs, from empty.

Reads the per-job ``benchmark:`` files of a finished run (``results/benchmarks/...``) and, for each
target, asks Snakemake (a dry run in an empty folder) which jobs building it from nothing would run.
Jobs shared between targets count in each of them; the ``all`` row counts every job once.

    python benchmarks/target_times.py                      # this checkout's results/ and config.yaml
    python benchmarks/target_times.py --run-dir /path/to/run --configfile workflow/configs/smoke.yaml
"""

from __future__ import annotations

import argparse
import csv
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from dpace.experiments import ARTIFACTS

REPO = Path(__file__).resolve().parents[1]
# Every table and figure (dpace.experiments.ARTIFACTS), then the group targets of workflow/rules/report.smk.
TARGETS = [f"results/{artifact.file}" for artifact in ARTIFACTS.values()] + ["ablations", "sweeps", "figures", "all"]


def planned_benchmark_files(target: str, configfile: Path | None) -> list[str]:
    """The ``benchmark:`` path of every job a dry run from an empty folder plans for ``target``."""
    with tempfile.TemporaryDirectory() as empty:
        command = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "-d", empty, "-n", "--cores", "2"]
        if configfile:
            command += ["--configfile", str(configfile.resolve())]
        result = subprocess.run([*command, "--", target], capture_output=True, text=True, cwd=REPO)
    if result.returncode:
        raise RuntimeError(f"dry run of {target} failed:\n{result.stderr[-2000:]}")
    return re.findall(r"^\s+benchmark: (\S+)$", result.stdout + result.stderr, re.MULTILINE)


def job_seconds(run_dir: Path, benchmark_file: str) -> float | None:
    path = run_dir / benchmark_file
    if not path.exists():
        return None
    with open(path) as handle:
        rows = list(csv.DictReader(handle, delimiter="\t"))
    return float(rows[-1]["s"]) if rows else None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-dir", type=Path, default=REPO, help="folder holding the finished run's results/")
    parser.add_argument("--configfile", type=Path, default=None, help="the run's config (default: config.yaml)")
    parser.add_argument("targets", nargs="*", default=TARGETS)
    args = parser.parse_args(argv)

    print("| target | jobs | summed job wall time | of which training | of which evaluation |")
    print("|---|---|---|---|---|")
    for target in args.targets:
        files = planned_benchmark_files(target, args.configfile)
        times = {f: job_seconds(args.run_dir, f) for f in files}
        missing = [f for f, s in times.items() if s is None]
        total = sum(s for s in times.values() if s)
        train = sum(s for f, s in times.items() if s and "/benchmarks/train/" in f)
        evaluate = sum(s for f, s in times.items() if s and "/benchmarks/eval/" in f)
        note = f" ({len(missing)} job(s) without a benchmark file)" if missing else ""
        print(f"| `{target}` | {len(files)} | {total / 60:.1f} min{note} | {train / 60:.1f} min | {evaluate / 60:.1f} min |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

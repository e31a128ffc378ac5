"""The paper-shape benchmarks build what their flags say (issue 43: bench_objectives hard-coded SDPA,
so ``--attention flex_attention`` passed a BlockMask into SDPA on the first GPU), and run in-process as
``python -m dpace.gpu_check`` runs them."""

from __future__ import annotations

import pytest
import torch

from dpace.gpu_check import BENCHMARKS, load_benchmark

TINY_OBJECTIVES = ["--hidden", "128", "--head-dim", "32", "--vocab", "512", "--seq-len", "48", "--anchors", "6",
                   "--block-size", "8"]


@pytest.fixture(scope="module")
def bench_objectives():
    return load_benchmark("bench_objectives")


def _forward_losses(module, attention: str) -> dict[str, float]:
    """The benchmark's own drafter and training wrappers, built for ``attention``; one forward each
    (no backward: PyTorch has no CPU backward for flex_attention)."""
    args = module.parse_args([*TINY_OBJECTIVES, "--attention", attention, "--objectives", "dflash", "dpace"])
    draft, lm_head, embed = module.build_modules(args)
    assert draft.config._attn_implementation == attention
    models = module.objective_models(args, draft, lm_head, embed)
    input_ids, hidden_states, loss_mask, _ = module.build_batch(args)
    losses = {}
    with torch.no_grad():
        for name in ("dflash", "dpace", "specforge:dpace"):
            torch.manual_seed(0)  # the same anchors for both attentions
            losses[name] = float(models[name](input_ids, hidden_states, loss_mask)[0])
    return losses


def test_bench_objectives_attends_with_the_attention_it_is_given(bench_objectives):
    flex = _forward_losses(bench_objectives, "flex_attention")  # a BlockMask through flex_attention layers
    sdpa = _forward_losses(bench_objectives, "sdpa")
    assert all(torch.isfinite(torch.tensor(value)) for value in flex.values())
    assert flex == pytest.approx(sdpa, rel=1e-4)  # same weights, same anchors: the same losses


def test_bench_objectives_builds_on_the_device_it_is_given(bench_objectives):
    args = bench_objectives.parse_args([*TINY_OBJECTIVES, "--device", "meta"])
    draft, lm_head, embed = bench_objectives.build_modules(args)
    # built there, not on the CPU first: a meta tensor has no values to initialise or copy
    assert {t.device.type for t in [*draft.parameters(), lm_head.weight, embed.weight]} == {"meta"}
    assert {p.dtype for p in draft.parameters()} == {torch.float32}  # trained weights stay float32 (autocast)


def test_bench_decoding_builds_its_models_in_the_dtype_it_is_given():
    module = load_benchmark("bench_decoding")
    args = module.parse_args(["--preset", "qwen3-tiny", "--dtype", "bfloat16"])
    target, drafter, prompt_ids = module.preset_models(args)
    assert {p.dtype for p in [*target.parameters(), *drafter.parameters()]} == {torch.bfloat16}
    assert len(prompt_ids) == args.prompt_tokens


def test_gpu_check_runs_both_benchmarks_in_process(capsys):
    """``run_benchmarks`` imports each benchmark and calls it with the check's flags (the CPU cut here)."""
    from dpace.gpu_check import run_benchmarks

    times = {}
    assert run_benchmarks(cpu=True, timeout_s=300, times=times)
    assert list(times) == [name for name, *_ in BENCHMARKS]
    out = capsys.readouterr().out
    assert "| dpace |" in out and "greedy: speculative == autoregressive" in out
    # the GPU flags are the ones each benchmark's parser accepts, and they keep the paper's shapes
    for _, name, gpu_flags, _ in BENCHMARKS:
        args = load_benchmark(name).parse_args(gpu_flags)
        assert args.device == "cuda"
    objectives = load_benchmark("bench_objectives").parse_args(BENCHMARKS[0][2])
    assert (objectives.attention, objectives.precision, objectives.hidden, objectives.seq_len) == (
        "flex_attention", "bf16", 2560, 2048)


def test_bench_training_step_counts_the_products_it_replays():
    """The step benchmark's synthetic features have the default's shapes (three SmolLM2-wide layers, bf16,
    answers of at most 64 supervised tokens after a prompt), and the FLOP it replays per recorded product are
    the products' own (mm: 2mkn, bmm: 2bmkn), so its peak is measured on the step's work."""
    from collections import Counter

    module = load_benchmark("bench_training_step")
    features = module.synthetic_features(6, vocab_size=512, hidden_size=16)
    assert features.hidden.shape == (int(features.offsets[-1]), 48) and features.hidden.dtype == torch.bfloat16
    answers = [int(features.loss_mask[features.offsets[i]:features.offsets[i + 1]].sum()) for i in range(6)]
    assert all(8 <= n <= 64 for n in answers) and int(features.input_ids.max()) < 512
    shapes = module._ProductShapes()
    with shapes:
        torch.mm(torch.ones(4, 3), torch.ones(3, 5))
        torch.addmm(torch.ones(5), torch.ones(4, 3), torch.ones(3, 5))
        torch.bmm(torch.ones(2, 4, 3), torch.ones(2, 3, 5))
    assert module.product_flop(Counter(shapes.shapes)) == 2 * 4 * 3 * 5 * 2 + 2 * 2 * 4 * 3 * 5

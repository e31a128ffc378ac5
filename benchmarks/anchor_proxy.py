"""Why decoded tau sits below the teacher-forced proxy: score every answer position, then anchor as decoding does.

For each of a run's target T=0 benchmark answers (first turns, from an autoregressive-baseline jsonl), the
decoding class (``dflash.model.DFlashDraftModel``, float32, no cache) drafts one block at every answer
position p from the target's features of the tokens before p, and counts the leading draft tokens equal
to the answer's. The mean of 1 + that count over all positions is the teacher-forced proxy
(``learning_curve.py``'s); anchoring at the first answer token and moving by accepted + 1, as speculative
decoding does at T=0, gives the tau decoding will measure on those answers.

    python benchmarks/anchor_proxy.py --run-dir <run> --drafter <run>/results/drafters/<t>/<variant>/epoch-6
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import torch.nn.functional as F

from dpace.evaluation.decoding import _context_features, _output_head
from dpace.targets import load_target
from dpace.training.drafter import draft_output_head, load_drafter


def accepted_at_every_position(drafter, target, ids: torch.Tensor, answer_start: int) -> list[int]:
    """Accepted draft tokens of a block anchored at each answer position (teacher-forced on ``ids``)."""
    block_size, mask_id = int(drafter.block_size), int(drafter.mask_token_id)
    head = draft_output_head(drafter.config, _output_head(target))
    embeddings = target.get_input_embeddings().weight
    features = _context_features(target(ids, output_hidden_states=True).hidden_states, list(drafter.target_layer_ids))
    accepted = []
    for anchor in range(answer_start, ids.shape[1] - 1):
        block = torch.full((1, block_size), mask_id)
        block[0, 0] = ids[0, anchor]
        hidden = drafter(target_hidden=features[:, :anchor], noise_embedding=F.embedding(block, embeddings),
                         position_ids=torch.arange(anchor + block_size)[None], past_key_values=None, use_cache=False)
        draft = drafter.compute_logits(hidden[0, 1:, :], head).argmax(-1)
        truth = ids[0, anchor + 1 : anchor + block_size]
        matches = (draft[: len(truth)] == truth).int()
        accepted.append(int(matches.cumprod(0).sum()))
    return accepted


def decoding_anchors_tau(accepted: list[int]) -> float:
    """Mean emitted length when each block starts right after the previous block's emitted tokens."""
    position, emitted = 0, []
    while position < len(accepted):
        emitted.append(accepted[position] + 1)
        position += accepted[position] + 1
    return sum(emitted) / len(emitted)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", required=True, help="a finished run (the folder holding results/)")
    parser.add_argument("--drafter", required=True, help="a drafter checkpoint folder")
    parser.add_argument("--target", default="smollm2-135m")
    args = parser.parse_args()
    # this folder's script: the same answers its benchmark proxy scores
    from learning_curve import benchmark_answers

    results = Path(args.run_dir) / "results"
    target, tokenizer = load_target(results / "targets" / args.target / "target.json")
    drafter = load_drafter(args.drafter)
    answers = benchmark_answers(results, tokenizer, results / "eval" / args.target / "autoregressive-baseline.jsonl")
    per_benchmark: dict[str, list[tuple[float, float]]] = {}
    with torch.no_grad():
        for benchmark, prompt, answer in answers:
            accepted = accepted_at_every_position(drafter, target, torch.tensor([prompt + answer]), len(prompt))
            proxy = sum(a + 1 for a in accepted) / len(accepted)
            per_benchmark.setdefault(benchmark, []).append((proxy, decoding_anchors_tau(accepted)))
    print("benchmark  all-positions proxy  decoding's anchors")
    for benchmark, scores in per_benchmark.items():
        print(f"{benchmark:10s} {sum(p for p, _ in scores) / len(scores):.3f}  {sum(t for _, t in scores) / len(scores):.3f}")
    means = [(sum(p for p, _ in s) / len(s), sum(t for _, t in s) / len(s)) for s in per_benchmark.values()]
    print(f"{'average':10s} {sum(p for p, _ in means) / len(means):.3f}  {sum(t for _, t in means) / len(means):.3f}")


if __name__ == "__main__":
    main()

"""dpace: reproduce and extend D-PACE (arXiv 2605.18810) for DFlash-style block drafters.

One module per concern; none of them knows about Snakemake:

- ``objectives``   every training loss of the paper (and extensions) as ``block_loss``
- ``drafter``      SpecForge DFlash draft models and the objective-aware training wrapper
- ``data``         benchmark prompts and ShareGPT training prompts (hub or local mirror)
- ``targets``      loading target LLMs (embedded SmolLM2, tiny random smoke target, hub ids)
- ``generation``   stage 3, responses: the target answers the training prompts (transformers on CPU,
                   SGLang on GPU)
- ``features``     cached target hidden states for drafter training
- ``training``     the drafter training loop (``training_records``: its steps.jsonl and summary.json;
                   ``draft_vocab``: the optional pruned draft vocabulary; ``train_config``: its settings,
                   built from the config's train section)
- ``decoding``     speculative and autoregressive decoding with per-block records
- ``evaluation``   tau / speedup on the six benchmarks (``replay``: tau replayed over the target's answers,
                   checked against decoding; ``intervals``: paired and seed-level bootstrap intervals)
- ``tables``, ``figures``  rendering the paper's tables and figures from a tidy metrics CSV
                   (``metrics_frame``: the row selection they share; ``experiments``: the registry of
                   every table and figure, what it reads and which reference drafters it draws)
- ``config``, ``schema``  the config's checks and experiments; the schema's defaults and enums
- ``findings``     the scorecard of the paper's claims (``workflow/claims.yaml``) from the metrics
- ``gpu_check``    ``python -m dpace.gpu_check``: one GPU checked end to end (``training_check``: GPU
                   training against a committed CPU reference curve)
"""

__version__ = "0.1.0"

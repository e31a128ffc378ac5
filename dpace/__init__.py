"""dpace: reproduce and extend D-PACE (arXiv 2605.18810) for DFlash-style block drafters.

Laid out like the DAG: a stage that one module does is a module, a stage of several modules is a folder;
the code every stage shares sits at the top. None of it knows about Snakemake.

- ``data``         stage 1: benchmark prompts and ShareGPT training prompts (hub or local mirror)
- ``targets``      stage 2: loading target LLMs (embedded SmolLM2, tiny random smoke target, hub ids)
- ``responses/``   stage 3: the target answers the training prompts (``generation``: transformers on CPU,
                   SGLang's engine on GPU), or its released answers are imported (``conversations``)
- ``features``     stage 4: cached target hidden states for drafter training (and which target layers a
                   drafter reads)
- ``training/``    stage 5: ``objectives`` (every training loss of the paper and extensions: each objective's
                   weight function beside the shared loss code), ``drafter`` (SpecForge DFlash draft models),
                   ``online_model`` (the objective-aware training wrapper), ``draft_vocab`` (the optional
                   pruned draft vocabulary), ``train_config`` (the settings, from the config's train section),
                   ``loop`` (the local training loop: check, set-up, loop, save), ``training_records``
                   (steps.jsonl and summary.json), ``specforge_run`` (a SpecForge run as data: GPU split, run
                   YAML, its inputs), ``specforge_backend`` (training through SpecForge on GPUs: our objectives
                   registered, the run launched and exported), ``training_check`` (GPU training against the
                   committed CPU reference curve ``training_reference.json``)
- ``evaluation/``  stage 6: ``eval_config`` (the settings, from the config's eval section), ``decoding``
                   (speculative and autoregressive decoding with per-block records), ``replay`` (tau replayed
                   over the target's answers, checked against decoding), ``requests`` (plan -> resumable
                   requests -> records; the multi-turn loop), ``evaluate`` (tau / speedup on the six
                   benchmarks, the autoregressive baseline), ``target_answers`` (the baseline's files an
                   evaluation reads), ``eval_records`` (the per-request records and their summary),
                   ``sglang_backend`` (the same, served by SGLang), ``timing_run`` (SR: the target and an
                   experiment's drafters decoded interleaved, repeated)
- ``report/``      stage 7: ``collect`` (the tidy metrics, per-block, comparison and training CSVs),
                   ``intervals`` (paired and seed-level bootstrap intervals), ``metrics_frame`` (the row
                   selection tables and figures share), ``latex`` (LaTeX helpers), ``tables/`` (one module per
                   table), ``figures``, ``render`` (one artifact from the CSVs), ``findings`` (the scorecard
                   of the paper's claims, ``workflow/claims.yaml``: the file read and checked, its claims
                   measured, the page written), ``verdicts`` (its rules: units, the matched paper cell, a
                   cell's and a claim's verdict), ``claim_measures`` (how each kind of claim is measured in
                   results/), ``scorecard_page`` (the page as Markdown), ``scale`` (a gain's gradient
                   across strata), ``timing`` (SR and step-time intervals over prompts, steps and repeats, and whether
                   the machine repeats a timing; windows of one run's steps)
- shared           ``config``, ``schema`` (the config's checks and its expansion into drafter variants; the
                   schema's defaults and enums), ``experiments`` (the registry of experiments: how each
                   expands into drafters, its tables and figures with their renderers), ``paths`` (where
                   each stage writes under results/),
                   ``objective_records`` (every objective's record: hyper-parameters, defaults, labels,
                   colours, captions; no torch), ``io`` (atomic files, jsonl and JSON read naming the damaged
                   file, checkpoint checksums), ``locks`` (this user's machine-wide locks: GPU slots, the
                   timing lock), ``gpus`` (one locked GPU per job, the SGLang install check), ``fingerprint`` (which modules a job runs),
                   ``gpu_check`` (``python -m dpace.gpu_check``: one GPU checked end to end), ``timing_records``
                   (the timing jobs' record format), ``step_timing`` (Table 7: DFlash's and D-PACE's training
                   steps interleaved in one process, with the training loop's own set-up and step)

This is the one module map; the stage packages' docstrings say what their stage does. Between stages, imports
go down the DAG: a stage imports shared modules and earlier stages' (``evaluation`` the drafter of ``training``
and the layer choice of ``features``, ``report`` the training records), never a later stage's
(tests/test_imports.py). Of the shared modules, ``config`` checks a config against ``data``'s and
``responses.conversations``' data sets, and ``gpu_check`` runs ``training.training_check``; ``config`` and
``experiments``, which every Snakefile parse imports, load no torch.
"""

__version__ = "0.1.0"

"""Stage 6, evaluation: the trained drafter against its target on the benchmarks.

``eval_config`` (the settings, from the config's eval section), ``decoding`` (speculative and autoregressive
decoding, per-block records), ``replay`` (tau replayed over the target's answers), ``requests`` (plan ->
resumable requests -> records), ``evaluate`` (tau and speedup per benchmark, the autoregressive baseline),
``target_answers`` (the baseline's files an evaluation reads), ``eval_records`` (the per-request records and
their summary) and ``sglang_backend`` (the same measurement served by SGLang).
"""

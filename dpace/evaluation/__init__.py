"""Stage 6, evaluation: the trained drafter against its target on the benchmarks.

``decoding`` (speculative and autoregressive decoding, per-block records), ``replay`` (tau replayed over the
target's answers), ``evaluate`` (tau and speedup per benchmark, the autoregressive baseline), ``eval_records``
(the per-request records and their summary) and ``sglang_backend`` (the same measurement served by SGLang).
"""

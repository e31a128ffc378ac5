"""Stage 6, evaluation: the trained drafter against its target on the benchmarks (its modules: the module map
in ``dpace/__init__.py``)."""

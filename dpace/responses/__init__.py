"""Stage 3, responses: the training conversations, answered by the target or imported where its answers were
released (its modules: the module map in ``dpace/__init__.py``)."""

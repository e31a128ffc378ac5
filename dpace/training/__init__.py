"""Stage 5, training: the drafter and how it learns (its modules: the module map in ``dpace/__init__.py``)."""

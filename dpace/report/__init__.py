"""Stage 7, report: from evaluation summaries and training records to the paper's tables, figures and claims
(its modules: the module map in ``dpace/__init__.py``)."""

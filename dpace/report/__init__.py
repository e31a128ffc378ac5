"""Stage 7, report: from evaluation summaries and training records to the paper's tables, figures and claims.

``collect`` (the tidy metrics / blocks / comparisons / training CSVs), ``intervals`` (paired and seed-level
bootstrap intervals), ``metrics_frame`` (row selection shared by tables and figures), ``latex`` (LaTeX helpers),
``tables`` (one module per table), ``figures``, ``render`` (one artifact of ``dpace.experiments.ARTIFACTS``)
and ``findings`` (the scorecard of ``workflow/claims.yaml``).
"""

"""The paper's tables (and two extension tables) as LaTeX, one module per table (or per family of
tables sharing a layout), named after the experiment it shows; ``dpace.report.latex`` holds the LaTeX
helpers, ``dpace.report.metrics_frame`` the row selection shared with the figures.

Every public ``table_*`` function is pure: it takes DataFrames and returns one LaTeX ``table``
environment as a string (booktabs rules; ``\\multirow`` and ``\\resizebox`` need the ``multirow`` and
``graphicx`` packages).  Nothing here reads files or knows about Snakemake.

Input contract (see the project brief; only these columns are used):

* ``metrics`` -- one row per (variant, epoch, benchmark, temperature) with ``target``,
  ``target_label``, ``variant``, ``experiment``, ``objective``, ``depth``, ``block_size``, ``alpha``,
  ``epoch``, ``benchmark``, ``temperature``, ``tau``, ``speedup``; ``normalization`` for
  :func:`table_normalization`; an optional ``k`` names the top-k of ``topk-prefix`` runs.
* ``train_runs`` -- per-run summary with ``variant``, ``objective``, ``block_size``, ``steps``,
  ``time_per_epoch_s``, ``time_per_step_s`` (``epochs`` unused).
* ``blocks`` -- per-block decoding records with ``variant``, ``benchmark``, ``temperature``,
  ``prompt_index``, ``tau_block``, ``sum_q``, ``surrogate``.

Conventions shared by all tables:

* "final epoch" means each variant's last evaluated epoch unless ``epoch=`` is given;
* averages are taken over the benchmarks present in the table; a run that lacks one of them
  (or any other number a cell shows) fails naming the cell (``latex.MissingCell``), never an average
  over fewer benchmarks nor a ``--`` (kept for values a complete row leaves undefined);
* a table for experiment G takes its rows from G; the reference runs a paper table shares with the
  main experiment (the DFlash / D-PACE rows of the same target, depth and block size) are
  borrowed from experiment ``main`` when G lacks them;
* the best value of each row group is bold (ties at the displayed precision all bold; a single
  candidate is not bold), and the D-PACE method label is bold as in the paper;
* a missing experiment raises ``ValueError`` naming it; duplicated runs raise too.
"""

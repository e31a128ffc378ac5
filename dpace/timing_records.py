"""The timing jobs' record format (``dpace.evaluation.timing_run`` writes it, ``dpace.report.timing`` reads it).
Imports nothing: a change to the report's statistics does not rerun a timing job."""

AUTOREGRESSIVE = "autoregressive"  # the drafter column's value for the target decoding alone
TIMING_COLUMNS = ["target", "temperature", "benchmark", "prompt_index", "id", "turn", "repeat", "position", "drafter",
                  "num_output_tokens", "decode_time_s", "time_per_output_token_s"]

"""Two scorecards of the same run's drafters, claim by claim: did a second measurement change a verdict?

Prints the headline of each page, then a table of the claims whose verdicts differ (and the count of the
rest), as a closing note gives a stability rerun (issue 58):

    python benchmarks/compare_findings.py results/findings.md /path/to/second/results/findings.md
"""

from __future__ import annotations

import argparse
from pathlib import Path

from dpace.report.scorecard_page import headline, stability_table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("first", type=Path)
    parser.add_argument("second", type=Path)
    args = parser.parse_args()
    first, second = args.first.read_text(), args.second.read_text()
    print(f"first: {headline(first)}\n\nsecond: {headline(second)}\n")
    print("\n".join(stability_table(first, second)))


if __name__ == "__main__":
    main()

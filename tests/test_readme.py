"""The front door stays true: the README's two commands are what CI runs, and every relative link and
#anchor in README.md and docs/*.md resolves (GitHub's heading slugs)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")


def github_slug(heading: str) -> str:
    """GitHub's anchor of a heading: markup dropped, lower case, punctuation but '-' and '_' removed,
    spaces to '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading's anchor in ``page``; a repeated heading gets -1, -2, ... as on GitHub."""
    seen: dict[str, int] = {}
    out = set()
    in_code = False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        match = None if in_code else re.match(r"^#{1,6} (.*)$", line)
        if match:
            slug = github_slug(match.group(1))
            out.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
            seen[slug] = seen.get(slug, 0) + 1
    return out


def links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # code blocks hold no links
    text = re.sub(r"`[^`\n]*`", "", text)
    return [a or b for a, b in LINK.findall(text)]


def test_github_slugs():
    assert github_slug("Table 1 of the 2-layer default on the AMD EPYC with AVX2 only (commit 318d457)") == \
        "table-1-of-the-2-layer-default-on-the-amd-epyc-with-avx2-only-commit-318d457"
    assert github_slug("`all` with the 2-layer default (Xeon with AMX, commit 93ad7ff)") == \
        "all-with-the-2-layer-default-xeon-with-amx-commit-93ad7ff"
    assert github_slug("Training objectives (`dpace.objectives`)") == "training-objectives-dpaceobjectives"
    assert github_slug("Table 1 with a window of 8 (the 318d457 run's answers)") == \
        "table-1-with-a-window-of-8-the-318d457-runs-answers"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_relative_link_and_anchor_resolves(page):
    broken = []
    for link in links(page):
        if re.match(r"^[a-z]+:", link):  # http(s), mailto: not checked offline
            continue
        path, _, anchor = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        if not target.exists():
            broken.append(f"{link}: no file {target}")
        elif anchor and target.suffix == ".md" and anchor not in anchors(target):
            broken.append(f"{link}: no heading #{anchor} in {target.relative_to(REPO)}")
    assert not broken, "\n".join(broken)


def bash_blocks(text: str) -> list[list[str]]:
    return [[line.strip() for line in block.splitlines() if line.strip()]
            for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S)]


def test_the_readmes_two_commands_are_what_ci_runs():
    """The set-up commands a newcomer copies: `.ci/install` then the tests (what `.ci/run` runs, in a
    fresh virtual environment), and `.ci/install` then Table 1."""
    readme = (REPO / "README.md").read_text()
    quick_start = readme.split("\n## Quick start", 1)[1].split("\n## ", 1)[0]
    first, second = bash_blocks(quick_start)[:2]
    commands = first + second
    assert commands == ["bash .ci/install && snakemake --cores all results/table_main.tex",
                        "bash .ci/install && python3 -m pytest -q"], commands
    ci = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()
          if line.strip().startswith(("bash ", "python3 -m pytest"))]
    # the cluster the tests submit to (tests/test_cluster.py; README, "On a cluster") is started before them
    assert ci == ["bash .ci/install", "bash workflow/cluster/slurm.sh up", "python3 -m pytest -q"], ci
    install, tests = commands[1].split(" && ")
    assert [install, tests] == [ci[0], ci[-1]]
    assert commands[0].split(" && ")[0] == ci[0]


def test_the_readme_is_a_front_door():
    """At most ~280 lines, and commit hashes only in its one results section."""
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 280
    outside = re.sub(r"\n## Results.*?(?=\n## )", "\n", readme, flags=re.S)
    hashes = [h for h in re.findall(r"\b[0-9a-f]{7}\b", outside) if re.search(r"\d", h) and re.search(r"[a-f]", h)]
    assert not hashes, hashes

"""Write docs/validate-checks.md from the check registry (``episodekit.validate.checks``).

    .venv/bin/python scripts/gen_check_docs.py          # rewrite the page
    .venv/bin/python scripts/gen_check_docs.py --check  # exit 1 if the page is out of date

``tests/repo/test_docs.py`` runs the same comparison, so the page and ``validate --list-checks``
never disagree. Each check's row carries an anchor named by its id: the help link every output
format gives (``docs/validate-checks.md#data.nan``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

PAGE = Path(__file__).resolve().parents[1] / "docs" / "validate-checks.md"


def render() -> str:
    """The page's text: one table row per check, grouped by the id's prefix."""
    from episodekit.validate.checks import EPISODE_PAGES, METADATA, REGISTRY
    from episodekit.validate.scope import PARTIAL

    def metadata_only(c) -> str:
        if c.id in PARTIAL:
            return "in part"
        if c.reads == METADATA:
            return "yes"
        return "no; sampled" if c.reads == EPISODE_PAGES else "no"

    out = [
        "# Validation checks",
        "",
        "Generated from the check registry by `scripts/gen_check_docs.py` (the same list as",
        "`episodekit validate --list-checks`); select with `--select all,-layout,quality.jump` or",
        "`--ignore layout`. The severity is the check's default (a few findings of a check are",
        "milder, e.g. `video.readable` without PyAV); `--fail-on warning` makes warnings fail.",
        "How each group works: [Validation](validate.md). The `metadata-only` column: whether",
        "`--metadata-only` runs the check (`in part`: on what the metadata holds; `sampled`:",
        "`--sample-episodes N` runs it on the sampled episodes).",
    ]
    group = None
    for c in REGISTRY:
        if c.group != group:
            group = c.group
            out += [
                "",
                f"## `{group}.*`",
                "",
                "| check | severity | title | what it checks | metadata-only |",
                "|---|---|---|---|---|",
            ]
        what = ("(--deep) " if c.deep else "") + c.description
        cell = what.replace("|", "\\|")
        anchor = f'<a id="{c.id}"></a>`{c.id}`'
        out.append(f"| {anchor} | {c.severity} | {c.title} | {cell} | {metadata_only(c)} |")
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare only; exit 1 when different")
    args = ap.parse_args()
    text = render()
    if args.check:
        sys.exit(0 if PAGE.read_text() == text else 1)
    PAGE.write_text(text)


if __name__ == "__main__":
    main()

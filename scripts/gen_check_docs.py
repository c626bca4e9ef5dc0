"""Write docs/validate-checks.md from the check registry (``episodekit.validate.runner.CHECKS``).

    .venv/bin/python scripts/gen_check_docs.py          # rewrite the page
    .venv/bin/python scripts/gen_check_docs.py --check  # exit 1 if the page is out of date

``tests/repo/test_docs.py`` runs the same comparison, so the page and ``validate --list-checks``
never disagree.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

PAGE = Path(__file__).resolve().parents[1] / "docs" / "validate-checks.md"


def render() -> str:
    """The page's text: one table row per check id, grouped by the id's prefix."""
    from episodekit.validate.runner import CHECKS

    out = [
        "# Validation checks",
        "",
        "Generated from the check registry by `scripts/gen_check_docs.py` (the same list as",
        "`episodekit validate --list-checks`); select with `--checks all,-layout,quality.jump`.",
        "How each group works: [Validation](validate.md).",
    ]
    group = None
    for check_id, what in CHECKS.items():
        prefix = check_id.split(".")[0]
        if prefix != group:
            group = prefix
            out += ["", f"## `{prefix}.*`", "", "| check | what it checks |", "|---|---|"]
        cell = what.replace("|", "\\|")
        out.append(f"| `{check_id}` | {cell} |")
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

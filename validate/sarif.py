"""SARIF 2.1.0 output (``validate --format sarif``), for GitHub code scanning and other readers.

One run; one rule per check that ran (id, title, description, default level, help link into
docs/validate-checks.md); one result per finding: its level, message, the file under the root
(relative to the workspace, ``%SRCROOT%``, so that code scanning links it; the line for
info.json findings), logical locations for the episode, the frame ranges and the feature, and
the finding's stable fingerprint. A finding without a file is located at the root's
meta/info.json (the dataset's own description). With a baseline, known findings are marked
``unchanged`` and suppressed, new ones ``new``; the gone entries are in the run's properties.

GitHub takes at most 25,000 results per run and 10 MB of gzipped SARIF: past either, the most
severe results are kept (failing first, then errors, then warnings, registry order inside) and
the run says what was cut, in a tool notification and in its properties.

A metadata-only or sampled run (``--metadata-only``, ``--sample-episodes``) says so: its scope,
the checks not run and run in part (with the reasons) and its notes are in the run's properties
and in tool notifications (level ``note``), and its ``automationDetails.id`` names the scope
(``episodekit-validate-metadata-only/``), a category of its own, so that uploading it does not
close the code-scanning alerts of checks it did not run.
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from episodekit.core import jsonout
from episodekit.core.paths import INFO_FILE
from episodekit.core.version import __version__
from episodekit.validate import checks as registry
from episodekit.validate.baseline import fingerprint
from episodekit.validate.raw import Finding
from episodekit.validate.scope import FULL, scope_lines

if TYPE_CHECKING:
    from episodekit.validate.runner import Report

SCHEMA = (
    "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"
)
MAX_RESULTS = 25_000  # GitHub: results per run
MAX_GZIP_BYTES = 10 * 1024 * 1024  # GitHub: the uploaded file, gzipped
SRCROOT = "%SRCROOT%"
FRAME_RANGES = 20  # frame ranges named per result


def _base_dir() -> Path:
    """What relative URIs are relative to: the workspace on GitHub, else the current folder."""
    return Path(os.environ.get("GITHUB_WORKSPACE") or os.getcwd()).resolve()


def _artifact(root: str, rel: str, base: Path) -> dict[str, str]:
    """The artifactLocation of ``rel`` under ``root``: relative to ``base`` (``%SRCROOT%``)
    when inside it, else an absolute URI."""
    if "://" in root:
        return {"uri": root.rstrip("/") + "/" + quote(rel)}
    path = (Path(root) / rel).resolve()
    try:
        return {"uri": quote(path.relative_to(base).as_posix()), "uriBaseId": SRCROOT}
    except ValueError:
        return {"uri": path.as_uri()}


def _rule(check_id: str) -> dict[str, Any]:
    c = registry.get(check_id)
    text = c.description or c.title
    return {
        "id": c.id,
        "name": c.id,
        "shortDescription": {"text": c.title},
        "fullDescription": {"text": text},
        "help": {
            "text": f"{text} (see {c.help} in the episodekit repository)",
            "markdown": f"{text}\n\nSee `{c.help}` in the episodekit repository.",
        },
        "defaultConfiguration": {"level": c.severity},
        "properties": {"tags": [c.group], "deep": c.deep, "help": c.help},
    }


def _frames(f: Finding) -> list[tuple[int, int]]:
    d = f.details or {}
    frames = d.get("frames")
    out = []
    if isinstance(frames, list):
        for r in frames:
            if isinstance(r, (list, tuple)) and len(r) == 2:
                out.append((int(r[0]), int(r[1])))
    elif isinstance(d.get("frame"), int):
        out.append((d["frame"], d["frame"]))
    return out


def _logical(f: Finding) -> list[dict[str, Any]]:
    """Episode, frame ranges and feature as SARIF logical locations."""
    out: list[dict[str, Any]] = []
    ep = f"episode {f.episode}" if f.episode is not None else None
    if ep:
        out.append({"name": str(f.episode), "fullyQualifiedName": ep, "kind": "episode"})
    for a, b in _frames(f)[:FRAME_RANGES]:
        name = f"{a}-{b}"
        full = f"{ep} frames {name}" if ep else f"frames {name}"
        out.append({"name": name, "fullyQualifiedName": full, "kind": "frames"})
    if f.feature:
        full = f.feature if f.dimension is None else f"{f.feature}[{f.dimension}]"
        out.append({"name": f.feature, "fullyQualifiedName": full, "kind": "feature"})
    return out


def _result(report: Report, f: Finding, rule_index: dict[str, int], base: Path) -> dict:
    msg = f.message if f.episode is None else f"episode {f.episode}: {f.message}"
    rel = f.file or INFO_FILE
    physical: dict[str, Any] = {"artifactLocation": _artifact(report.root, rel, base)}
    # GitHub wants a region; files without lines (parquet, mp4) get the first line.
    physical["region"] = {"startLine": report.line(f) or 1}
    location: dict[str, Any] = {"physicalLocation": physical}
    logical = _logical(f)
    if logical:
        location["logicalLocations"] = logical
    out: dict[str, Any] = {
        "ruleId": f.check,
        "ruleIndex": rule_index[f.check],
        "level": "error" if f.severity == registry.ERROR else "warning",
        "message": {"text": msg},
        "locations": [location],
        "partialFingerprints": {"episodekit/v1": fingerprint(f)},
    }
    if report.baseline is not None:
        known = not report.is_new(f)
        out["baselineState"] = "unchanged" if known else "new"
        if known:
            just = f"in the baseline {report.baseline.path}"
            out["suppressions"] = [{"kind": "external", "justification": just}]
    props = {k: v for k, v in (("dimension", f.dimension), ("value", f.value)) if v is not None}
    if f.file is None:
        props["dataset"] = True  # located at info.json: the finding has no file of its own
    if props:
        out["properties"] = props
    return out


def _doc(report: Report, results: list[dict], rules: list[dict], cut: dict | None) -> dict:
    base = _base_dir()
    invocation: dict[str, Any] = {
        "executionSuccessful": True,
        "exitCode": report.exit_code(),
    }
    props: dict[str, Any] = {
        "root": report.root,
        "episodesFingerprint": report.fingerprint,
        "strict": report.strict,
        "checksRun": list(report.checks_run),
    }
    if cut:
        text = (
            f"{cut['kept']} of {cut['total']} results kept (GitHub takes {MAX_RESULTS:,} results "
            f"and {MAX_GZIP_BYTES // 2**20} MB gzipped per run): the most severe first; "
            "`validate --format json` lists every finding"
        )
        note = {"level": "warning", "message": {"text": text}}
        invocation["toolExecutionNotifications"] = [note]
        props["truncated"] = cut
    if report.baseline is not None:
        props["baseline"] = report.baseline.to_dict(report.findings)
    category = "episodekit-validate"
    if report.scope != FULL:
        category += f"-{report.scope}"
        sample = report.sample
        props["scope"] = {"mode": report.scope, "seed": report.seed, "sampleEpisodes": sample}
        props["checksSkipped"] = report.checks_skipped
        props["checksPartial"] = report.checks_partial
        props["notes"] = report.notes
        notes = [{"level": "note", "message": {"text": line}} for line in scope_lines(report)]
        invocation["toolExecutionNotifications"] = [
            *invocation.get("toolExecutionNotifications", []),
            *notes,
        ]
    return {
        "$schema": SCHEMA,
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": "episodekit",
                        "semanticVersion": __version__,
                        "version": __version__,
                        "rules": rules,
                    }
                },
                "automationDetails": {"id": f"{category}/"},
                "originalUriBaseIds": {SRCROOT: {"uri": base.as_uri() + "/"}},
                "invocations": [invocation],
                "results": results,
                "properties": props,
            }
        ],
    }


def _gzip_size(doc: dict) -> int:
    return len(gzip.compress(_dumps(doc).encode(), compresslevel=6))


def _dumps(doc: dict) -> str:
    return jsonout.dumps(doc, indent=1)


def sarif_document(
    report: Report, max_results: int = MAX_RESULTS, max_gzip_bytes: int = MAX_GZIP_BYTES
) -> dict:
    """The SARIF log of ``report`` as a dict, within ``max_results`` and ``max_gzip_bytes``."""
    base = _base_dir()
    ids = list(dict.fromkeys([*report.checks_run, *(f.check for f in report.findings)]))
    rules = [_rule(c) for c in ids]
    rule_index = {c: i for i, c in enumerate(ids)}
    ordered = report.sorted_findings()
    results = [_result(report, f, rule_index, base) for f in ordered[:max_results]]
    total = len(ordered)
    cut = None if total <= max_results else {"kept": len(results), "total": total}
    doc = _doc(report, results, rules, cut)
    if _gzip_size(doc) <= max_gzip_bytes:
        return doc
    lo, hi = 0, len(results)  # the most results that fit: lo fits, hi does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        trial = _doc(report, results[:mid], rules, {"kept": mid, "total": total})
        lo, hi = (mid, hi) if _gzip_size(trial) <= max_gzip_bytes else (lo, mid)
    return _doc(report, results[:lo], rules, {"kept": lo, "total": total})


def format_sarif(report: Report, **limits: int) -> str:
    """The SARIF log of ``report`` as JSON text (see :func:`sarif_document`)."""
    return _dumps(sarif_document(report, **limits)) + "\n"

"""JUnit XML output (``validate --format junit``), for CI systems that show test reports.

One test suite; one test case per check that ran (``classname`` ``episodekit.validate.<group>``);
a ``<failure>`` per finding that fails the run (type = its severity, message = where and what),
the first :data:`FAILURES_SHOWN` of a check with the count of the rest in the case's
``<system-out>``, which also lists the findings that do not fail (warnings, or findings a
baseline holds) and the check's help link. A check without failing findings passes. The
layout follows the JUnit schema Jenkins' xunit plugin validates against (junit-10.xsd).

A metadata-only or sampled run (``--metadata-only``, ``--sample-episodes``): each selected
check it did not run is a test case with ``<skipped>`` (message: why), a check run in part says
what it covered in its ``<system-out>``, and the suite's properties and ``<system-out>`` give
the scope, the sample and the notes.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from typing import TYPE_CHECKING

from episodekit.validate import checks as registry
from episodekit.validate.raw import Finding
from episodekit.validate.scope import FULL, scope_lines

if TYPE_CHECKING:
    from episodekit.validate.runner import Report

FAILURES_SHOWN = 50  # <failure> elements per test case
# Characters XML 1.0 cannot hold (a message quoting binary data may carry them).
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _text(s: str) -> str:
    return _NOT_XML.sub(lambda m: f"\\x{ord(m.group()):02x}", s)


def _what(f: Finding) -> str:
    where = []
    if f.file:
        where.append(f.file)
    if f.episode is not None:
        where.append(f"episode {f.episode}")
    if f.feature:
        where.append(f.feature if f.dimension is None else f"{f.feature}[{f.dimension}]")
    return f"{' '.join(where)}: {f.message}" if where else f.message


def _scope_properties(report: Report) -> list[tuple[str, str]]:
    """The suite's properties naming a metadata-only or sampled run's scope (none: full)."""
    if report.scope == FULL:
        return []
    out = [("scope", report.scope)]
    if report.sample is not None:
        sample = ",".join(map(str, report.sample))
        out += [("sample_seed", str(report.seed)), ("sample_episodes", sample)]
    return out


def format_junit(report: Report, shown: int = FAILURES_SHOWN) -> str:
    """The JUnit XML document of ``report`` (see the module docstring)."""
    by_check = registry.group_by_check(report.findings)
    ids = list(dict.fromkeys([*report.checks_run, *by_check]))
    failed = [c for c in ids if any(report.fails(f) for f in by_check.get(c, []))]
    skipped = [c for c in report.checks_skipped if c not in ids]
    seconds = f"{report.seconds:.3f}"
    suites = ET.Element(
        "testsuites",
        name="episodekit validate",
        tests=str(len(ids) + len(skipped)),
        failures=str(len(failed)),
        errors="0",
        time=seconds,
    )
    suite = ET.SubElement(
        suites,
        "testsuite",
        name=_text(f"episodekit validate {report.root}"),
        tests=str(len(ids) + len(skipped)),
        failures=str(len(failed)),
        errors="0",
        skipped=str(len(skipped)),
        time=seconds,
    )
    props = ET.SubElement(suite, "properties")
    for name, value in (
        ("root", report.root),
        ("episodes_fingerprint", report.fingerprint or ""),
        ("strict", str(report.strict).lower()),
        ("baseline", report.baseline.path if report.baseline else ""),
        *_scope_properties(report),
    ):
        ET.SubElement(props, "property", name=name, value=_text(value))
    for check_id in ids:
        check = registry.get(check_id)
        case = _testcase(suite, check_id, check.group)
        items = by_check.get(check_id, [])
        failing = [f for f in items if report.fails(f)]
        others = [f for f in items if not report.fails(f)]
        for f in failing[:shown]:
            failure = ET.SubElement(case, "failure", type=f.severity, message=_text(_what(f)))
            failure.text = _text(f"{_what(f)}\n{check.title}: {check.description}")
        out = []
        if len(failing) > shown:
            out.append(f"{len(failing)} failing findings; the first {shown} are listed")
        for f in others[:shown]:
            known = "" if report.is_new(f) else "in the baseline, "
            out.append(f"{known}{f.severity}: {_what(f)}")
        if len(others) > shown:
            out.append(f"... {len(others) - shown} more that do not fail")
        if check_id in report.checks_partial:
            out.append(f"run on {report.checks_partial[check_id]}")
        if items or check_id in report.checks_partial:
            out.append(f"help: {check.help}")
            ET.SubElement(case, "system-out").text = _text("\n".join(out))
    for check_id in skipped:
        check = registry.get(check_id)
        case = _testcase(suite, check_id, check.group)
        why = f"{report.scope} run: not run {report.checks_skipped[check_id]}"
        ET.SubElement(case, "skipped", message=_text(why))
    lines = scope_lines(report)
    if lines:
        ET.SubElement(suite, "system-out").text = _text("\n".join(lines))
    ET.indent(suites)
    body = ET.tostring(suites, encoding="unicode")
    return f'<?xml version="1.0" encoding="UTF-8"?>\n{body}\n'


def _testcase(suite: ET.Element, check_id: str, group: str) -> ET.Element:
    """The ``<testcase>`` of one check (run or not run) under ``suite``."""
    return ET.SubElement(
        suite, "testcase", name=check_id, classname=f"episodekit.validate.{group}", time="0"
    )

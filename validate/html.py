"""A self-contained HTML report of a validation run (``validate --report html:PATH``): one file a
reviewer opens from the CI artifacts, with nothing fetched from the network (inline CSS, no
script, plots embedded as base64 PNG).

It holds the verdict, a table per check (count, severity, what it guards against, help), every
finding (the first :data:`FINDINGS_SHOWN`, most severe first), the per-episode quality signals
(each flagged episode: length, task, the checks that flagged it with the measured values), and,
with matplotlib (``pip install 'episodekit[plots]'``), plots: episode lengths (flagged episodes
marked), each float feature's distribution per dimension from a sample of rows with the
quantiles of meta/stats.json marked, and the traces of the flagged episodes (the flagged frames
shaded). Without matplotlib the page is the same without plots, and says so. A metadata-only
or sampled run's page says what it did not read, and draws no plot that reads data pages (the
feature distributions, the traces): the page costs no more bytes than the run.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from episodekit.core.atomic import atomic_write_text
from episodekit.core.paths import INFO_FILE
from episodekit.core.words import plural
from episodekit.validate import checks as registry
from episodekit.validate.raw import Finding

if TYPE_CHECKING:
    from episodekit.validate.runner import Report

FINDINGS_SHOWN = 2000  # rows of the findings table
EPISODES_SHOWN = 500  # rows of the per-episode table
SAMPLE_ROWS = 20_000  # rows read for the feature distributions
DIMS_SHOWN = 32  # dimensions plotted per feature
TRACES = 8  # flagged episodes plotted
QUANTILES = ("q01", "q10", "q50", "q90", "q99")
PLOTS_HINT = "plots need matplotlib: pip install 'episodekit[plots]'"

CSS = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 2em; }
table { border-collapse: collapse; margin: 0.5em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f3f3f3; } td.n { text-align: right; }
.error { color: #b00020; font-weight: bold; } .warning { color: #a05a00; }
.ok { color: #1b7a1b; font-weight: bold; } .known { color: #777; }
.note { color: #555; font-style: italic; } img { max-width: 100%; }
code { background: #f6f6f6; padding: 0 3px; }
"""


def _e(x: object) -> str:
    return html.escape(str(x), quote=True)


def _value(v: float | None) -> str:
    if v is None:
        return ""
    try:
        return f"{v:.4g}"
    except (TypeError, ValueError):
        return str(v)


def _where(f: Finding) -> str:
    parts = []
    if f.file:
        parts.append(f.file)
    if f.episode is not None:
        parts.append(f"episode {f.episode}")
    if f.feature:
        parts.append(f.feature if f.dimension is None else f"{f.feature}[{f.dimension}]")
    return ", ".join(parts) or "dataset"


def _table(header: list[str], rows: list[list[str]], numeric: tuple[int, ...] = ()) -> str:
    """An HTML table; cells are already escaped HTML."""
    out = ["<table><tr>" + "".join(f"<th>{_e(h)}</th>" for h in header) + "</tr>"]
    for row in rows:
        cells = "".join(
            f'<td class="n">{c}</td>' if i in numeric else f"<td>{c}</td>"
            for i, c in enumerate(row)
        )
        out.append(f"<tr>{cells}</tr>")
    out.append("</table>")
    return "\n".join(out)


def _scope_html(report: Report) -> list[str]:
    """What a metadata-only or sampled run read and left out (nothing for a full run)."""
    from episodekit.validate.scope import FULL, scope_lines

    if report.scope == FULL:
        return []
    items = "".join(f"<li>{_e(line)}</li>" for line in scope_lines(report))
    return [f"<p>Scope: <b>{_e(report.scope)}</b>.</p>", f"<ul>{items}</ul>"]


def _summary(report: Report) -> str:
    by_check = registry.group_by_check(report.findings)
    if not by_check:
        return "<p>No findings.</p>"
    rows = []
    for check_id, items in by_check.items():
        c = registry.get(check_id)
        errors = any(f.severity == registry.ERROR for f in items)
        sev = registry.ERROR if errors else items[0].severity
        known = sum(not report.is_new(f) for f in items)
        count = str(len(items))
        if known:
            count += f' <span class="known">({known} in the baseline)</span>'

        rows.append(
            [
                f"<code>{_e(c.id)}</code>",
                f'<span class="{_e(sev)}">{_e(sev)}</span>',
                count,
                _e(c.title),
                f'{_e(c.description)} <span class="note">({_e(c.help)})</span>',
            ]
        )
    return _table(["check", "severity", "count", "title", "what it guards against"], rows, (2,))


def _findings(report: Report) -> str:
    ordered = report.sorted_findings()
    if not ordered:
        return ""
    rows = []
    for f in ordered[:FINDINGS_SHOWN]:
        known = not report.is_new(f)
        state = "in the baseline" if known else ("fails" if report.fails(f) else "")
        rows.append(
            [
                f"<code>{_e(f.check)}</code>",
                f'<span class="{_e(f.severity)}">{_e(f.severity)}</span>',
                _e(_where(f)),
                _e(_value(f.value)),
                _e(f.message),
                f'<span class="known">{_e(state)}</span>' if known else _e(state),
            ]
        )
    out = _table(["check", "severity", "where", "value", "message", ""], rows, (3,))
    if len(ordered) > FINDINGS_SHOWN:
        out += f'<p class="note">{len(ordered) - FINDINGS_SHOWN} more: see --format json.</p>'
    return out


def _episode_rows(report: Report, raw: Any) -> list[list[str]]:
    """One row per flagged episode: length, task, and each check that flagged it."""
    flagged: dict[int, list[Finding]] = {}
    for f in report.sorted_findings():
        if f.episode is not None:
            flagged.setdefault(int(f.episode), []).append(f)
    lengths, tasks = _episode_info(raw)
    rows = []
    for ep in sorted(flagged)[:EPISODES_SHOWN]:
        signals = "<br>".join(
            f"<code>{_e(f.check)}</code> {_e(f.feature or '')}"
            + (f"[{f.dimension}]" if f.dimension is not None else "")
            + (f" = {_e(_value(f.value))}" if f.value is not None else "")
            for f in flagged[ep]
        )
        rows.append([str(ep), _e(lengths.get(ep, "")), _e(tasks.get(ep, "")), signals])
    return rows


def _episode_info(raw: Any) -> tuple[dict[int, int], dict[int, str]]:
    if raw is None or raw.episodes is None:
        return {}, {}
    e = raw.episodes
    try:
        eps = [int(x) for x in e["episode_index"].to_pylist()]
        lengths = dict(zip(eps, (int(x) for x in e["length"].to_pylist())))
        tasks = dict(zip(eps, (", ".join(t or []) for t in e["tasks"].to_pylist())))
    except (KeyError, TypeError, ValueError):
        return {}, {}
    return lengths, tasks


# ---------------------------------------------------------------------------------------------
# Plots (matplotlib, optional)


def _png(fig: Any) -> str:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80)
    plt.close(fig)
    data = base64.b64encode(buf.getvalue()).decode("ascii")
    return f'<img alt="plot" src="data:image/png;base64,{data}">'


def _lengths_plot(report: Report, raw: Any) -> str:
    import matplotlib.pyplot as plt

    lengths, _ = _episode_info(raw)
    if not lengths:
        return ""
    flagged = {int(f.episode) for f in report.findings if f.episode is not None}
    eps = sorted(lengths)
    colors = ["#b00020" if ep in flagged else "#4a78b5" for ep in eps]
    fig, ax = plt.subplots(figsize=(9, 2.4))
    ax.bar(eps, [lengths[ep] for ep in eps], color=colors, width=1.0)
    ax.set_xlabel("episode (red: flagged)", fontsize=8)
    ax.set_ylabel("frames", fontsize=8)
    ax.set_title("episode lengths", fontsize=9)
    ax.tick_params(labelsize=7)
    fig.tight_layout()
    return _png(fig)


def _float_features(raw: Any) -> list[str]:
    out = []
    for name, feat in raw.features.items():
        if not isinstance(feat, dict) or feat.get("dtype") not in ("float32", "float64"):
            continue
        if name in ("timestamp",):
            continue
        out.append(name)
    return out


def _sample(raw: Any, features: list[str]) -> dict[str, Any]:
    """Up to :data:`SAMPLE_ROWS` rows of ``features`` (numpy, rows x dims), row groups taken
    evenly over the data files."""
    import numpy as np
    import pyarrow.parquet as pq

    from episodekit.validate.meta import unsafe_reason

    rels = [r for r in raw.data_files() if not r.startswith("<") and unsafe_reason(raw, r) is None]
    groups = []
    for rel in rels:
        try:
            with raw.fs.open(raw.join(rel), "rb") as fh:
                md = pq.ParquetFile(fh).metadata
            groups += [(rel, g, md.row_group(g).num_rows) for g in range(md.num_row_groups)]
        except Exception:  # noqa: BLE001 - an unreadable file is a finding already
            continue
    total = sum(n for *_, n in groups)
    if not total:
        return {}
    k = min(len(groups), max(1, math.ceil(SAMPLE_ROWS * len(groups) / total)))
    picked: dict[str, list[int]] = {}
    for i in sorted({round(x) for x in np.linspace(0, len(groups) - 1, k)}):
        rel, g, _ = groups[i]
        picked.setdefault(rel, []).append(g)
    parts: dict[str, list] = {c: [] for c in features}
    for rel, gs in picked.items():
        try:
            with raw.fs.open(raw.join(rel), "rb") as fh:
                pf = pq.ParquetFile(fh)
                cols = [c for c in features if c in pf.schema_arrow.names]
                t = pf.read_row_groups(gs, columns=cols)
        except Exception:  # noqa: BLE001 - an unreadable file is a finding already
            continue
        for c in cols:
            x = _matrix(t[c])
            if x is not None:
                parts[c].append(x)
    out = {}
    for c, xs in parts.items():
        if xs:
            x = np.concatenate(xs)
            out[c] = x[:: max(1, len(x) // SAMPLE_ROWS)]
    return out


def _matrix(col: Any) -> Any:
    """A column as floats (rows x dims), or None when it is not numeric."""
    import pyarrow as pa

    col = col.combine_chunks() if hasattr(col, "combine_chunks") else col
    try:
        if pa.types.is_fixed_size_list(col.type) or pa.types.is_list(col.type):
            flat = col.flatten().to_numpy(zero_copy_only=False).astype(float)
            n = len(col)
            return flat.reshape(n, -1) if n and flat.size % n == 0 else None
        return col.to_numpy(zero_copy_only=False).astype(float).reshape(-1, 1)
    except (pa.ArrowException, TypeError, ValueError):
        return None


def _stats(raw: Any) -> dict:
    try:
        with raw.fs.open(raw.join("meta/stats.json"), "rb") as fh:
            doc = json.loads(fh.read())
        return doc if isinstance(doc, dict) else {}
    except Exception:  # noqa: BLE001 - no stats: no quantiles marked (stats.* says why)
        return {}


def _feature_plot(name: str, x: Any, stats: dict) -> str:
    import matplotlib.pyplot as plt
    import numpy as np

    dims = min(x.shape[1], DIMS_SHOWN)
    cols = min(dims, 4)
    rows = math.ceil(dims / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(2.4 * cols, 1.7 * rows), squeeze=False)
    st = stats.get(name) if isinstance(stats.get(name), dict) else {}
    for j in range(rows * cols):
        ax = axes[j // cols][j % cols]
        if j >= dims:
            ax.axis("off")
            continue
        v = x[:, j]
        v = v[np.isfinite(v)]
        if v.size:  # one artist per histogram (ax.hist draws a patch per bin: slow)
            counts, edges = np.histogram(v, bins=40)
            ax.stairs(counts, edges, fill=True, color="#4a78b5")
        for q in QUANTILES:
            qv = _stat_at(st.get(q), j)
            if qv is not None:
                ax.axvline(qv, color="#b00020" if q in ("q01", "q99") else "#e08000", lw=0.8)
        ax.set_title(f"{name}[{j}]", fontsize=7)
        ax.tick_params(labelsize=6)
    fig.suptitle(f"{name}: sample of rows; lines at stats.json q01, q10, q50, q90, q99", fontsize=8)
    fig.subplots_adjust(left=0.05, right=0.98, bottom=0.08, top=0.9, hspace=0.6, wspace=0.3)
    out = _png(fig)
    if x.shape[1] > DIMS_SHOWN:
        out += f'<p class="note">first {DIMS_SHOWN} of {x.shape[1]} dimensions</p>'
    return out


def _stat_at(value: Any, j: int) -> float | None:
    try:
        import numpy as np

        a = np.asarray(value, dtype=float).reshape(-1)
        v = float(a[j]) if a.size > j else None
        return v if v is not None and math.isfinite(v) else None
    except (TypeError, ValueError):
        return None


def _trace_plot(raw: Any, f: Finding) -> str:
    import matplotlib.pyplot as plt
    import pyarrow.parquet as pq

    e = raw.episodes
    eps = e["episode_index"].to_pylist()
    if f.episode not in eps:
        return ""
    rel = e["data_file"][eps.index(f.episode)].as_py()
    with raw.fs.open(raw.join(rel), "rb") as fh:
        t = pq.read_table(
            fh, columns=["episode_index", f.feature], filters=[("episode_index", "=", f.episode)]
        )
    x = _matrix(t[f.feature])
    if x is None or not len(x):
        return ""
    dims = (
        [f.dimension]
        if f.dimension is not None and f.dimension < x.shape[1]
        else range(min(x.shape[1], 8))
    )
    fig, ax = plt.subplots(figsize=(9, 2.2))
    for j in dims:
        ax.plot(x[:, j], lw=1, label=f"[{j}]")
    for a, b in _frame_ranges(f):
        ax.axvspan(a, b + 1, color="#b00020", alpha=0.2)
    where = f.feature if f.dimension is None else f"{f.feature}[{f.dimension}]"
    ax.set_title(f"{f.check}: episode {f.episode}, {where} (flagged frames shaded)", fontsize=8)
    ax.set_xlabel("frame", fontsize=7)
    ax.tick_params(labelsize=7)
    if len(dims) > 1:
        ax.legend(fontsize=6, ncol=8)
    fig.tight_layout()
    return _png(fig)


def _frame_ranges(f: Finding) -> list[tuple[int, int]]:
    d = f.details or {}
    out = []
    for r in d.get("frames") or []:
        if isinstance(r, (list, tuple)) and len(r) == 2:
            out.append((int(r[0]), int(r[1])))
    if not out and isinstance(d.get("frame"), int):
        out.append((d["frame"], d["frame"]))
    return out


def _plots(report: Report, raw: Any) -> str:
    """The plots section; raises ImportError without matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    from episodekit.validate.scope import FULL

    parts = ["<h2>Episode lengths</h2>", _guard(lambda: _lengths_plot(report, raw))]
    if report.scope != FULL:  # the other plots read data pages the run did not read
        note = f"{report.scope} run: no feature distribution or trace (they read data pages)"
        return "\n".join([*parts, f'<p class="note">{_e(note)}.</p>'])
    feats = _float_features(raw)
    if feats:
        sample = _guard_value(lambda: _sample(raw, feats), {})
        stats = _stats(raw)
        parts.append("<h2>Feature distributions</h2>")
        for name in feats:
            if name in sample:
                parts.append(_guard(lambda name=name: _feature_plot(name, sample[name], stats)))
    traced = [
        f
        for f in report.sorted_findings()
        if f.episode is not None and f.feature and f.feature in raw.features
    ][:TRACES]
    if traced:
        parts.append("<h2>Flagged episodes</h2>")
        parts += [_guard(lambda f=f: _trace_plot(raw, f)) for f in traced]
    return "\n".join(p for p in parts if p)


def _guard(make: Any) -> str:
    """A plot, or one line saying why it is missing (a broken file must not lose the page)."""
    try:
        return make()
    except Exception as exc:  # noqa: BLE001 - the report is still useful without this plot
        return f'<p class="note">plot skipped: {_e(exc)}</p>'


def _guard_value(make: Any, default: Any) -> Any:
    try:
        return make()
    except Exception:  # noqa: BLE001 - see _guard
        return default


def format_html(report: Report, plots: bool = True) -> tuple[str, str]:
    """The page, and a note for the user ('' or why there are no plots)."""
    from episodekit.validate.raw import CannotValidate, read_raw

    try:
        raw = read_raw(report.root)
    except CannotValidate:
        raw = None
    n_err, n_warn = len(report.errors), len(report.warnings)
    failed = report.exit_code() != 0
    verdict = '<span class="error">FAILED</span>' if failed else '<span class="ok">OK</span>'
    head = (
        f"{verdict}: {plural(n_err, 'error')}, {plural(n_warn, 'warning')}; "
        f"{plural(len(report.checks_run), 'check')} in {report.seconds:.1f} s"
        + (" (warnings fail)" if report.strict else "")
    )
    body = [
        f"<h1>Validation report: <code>{_e(report.root)}</code></h1>",
        f"<p>{head}.</p>",
    ]
    if report.fingerprint:
        body.append(f'<p class="note">episodes fingerprint {_e(report.fingerprint)}</p>')
    body += _scope_html(report)
    if report.baseline is not None:
        b = report.baseline.to_dict(report.findings)
        body.append(
            f"<p>Baseline <code>{_e(b['file'])}</code>: {b['known']} findings known (they do "
            f"not fail), {b['new']} new, {len(b['gone'])} gone.</p>"
        )
        if report.baseline.gone:
            rows = [[f"<code>{_e(e.check)}</code>", _e(e.where())] for e in report.baseline.gone]
            body.append(_table(["gone", "where"], rows[:FINDINGS_SHOWN]))
    body += ["<h2>Checks with findings</h2>", _summary(report)]
    if report.findings:
        body += ["<h2>Findings</h2>", _findings(report)]
    rows = _episode_rows(report, raw)
    if rows:
        body += [
            "<h2>Flagged episodes: quality signals</h2>",
            _table(["episode", "length", "task", "flagged by"], rows, (0, 1)),
        ]
    note = ""
    if plots and raw is not None:
        try:
            body.append(_plots(report, raw))
        except ImportError:
            note = f"html report without plots: {PLOTS_HINT}"
            body.append(f'<p class="note">No plots: {_e(PLOTS_HINT)}.</p>')
    elif raw is None:
        body.append(f'<p class="note">No plots: {_e(INFO_FILE)} unreadable.</p>')
    page = (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>Validation report: {_e(report.root)}</title><style>{CSS}</style></head>\n"
        "<body>\n" + "\n".join(body) + "\n</body></html>\n"
    )
    return page, note


def write_html(report: Report, path: str | Path) -> str:
    """Write the HTML report atomically; returns a note for the user ('' when complete)."""
    page, note = format_html(report)
    atomic_write_text(Path(path), page)
    return note

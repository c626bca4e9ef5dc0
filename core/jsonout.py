"""One JSON encoder for every ``--json`` output: numpy scalars and arrays of every dtype become
plain JSON values, and NaN/inf become ``null`` (JSON has neither; the caller keeps the value in
its text, see :func:`nonfinite_text`). ``dumps`` never raises on a value a check can produce.
numpy is imported on first use (the CLI imports this module; ``--help`` stays numpy-free)."""

from __future__ import annotations

import datetime as _dt
import json
import math
from typing import Any


def _scalar(v: Any) -> Any:
    """A Python or numpy scalar as a JSON value."""
    import numpy as np  # here: `episodekit --help` must not import numpy

    if isinstance(v, (np.datetime64, np.timedelta64)):  # before integer: timedelta64 is one
        return str(v)
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if isinstance(v, (int, np.integer)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        f = float(v)
        return f if math.isfinite(f) else None
    if isinstance(v, (complex, np.complexfloating)):
        return [_scalar(v.real), _scalar(v.imag)]
    if isinstance(v, (bytes, np.bytes_)):
        return bytes(v).decode("utf-8", "replace")
    if isinstance(v, (_dt.date, _dt.time, _dt.timedelta)):
        return str(v)
    if isinstance(v, np.void):
        return [to_jsonable(x) for x in v.tolist()] if v.dtype.names else bytes(v).hex()
    if isinstance(v, np.generic):
        return to_jsonable(v.item())
    return str(v)


def to_jsonable(v: Any) -> Any:
    """``v`` with every numpy value, non-finite float, tuple, set and odd key made plain JSON."""
    if v is None or isinstance(v, str):
        return v
    import numpy as np

    if isinstance(v, dict):
        return {str(k): to_jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple, set, frozenset)):
        return [to_jsonable(x) for x in v]
    if isinstance(v, np.ndarray):
        if v.dtype.kind in "Mm":
            return (
                np.datetime_as_string(v).tolist() if v.dtype.kind == "M" else v.astype(str).tolist()
            )
        return [to_jsonable(x) for x in v] if v.ndim else to_jsonable(v[()])
    return _scalar(v)


def nonfinite_text(v: Any) -> str | None:
    """``"nan"``/``"inf"``/``"-inf"`` for a non-finite real scalar (null in JSON), the complex
    number's text for a non-finite complex one, else None (a complex value is not cast to float:
    numpy warns that the imaginary part is lost)."""
    try:
        c = complex(v)
    except (TypeError, ValueError, OverflowError):
        return None
    if math.isfinite(c.real) and math.isfinite(c.imag):
        return None
    return repr(c.real) if c.imag == 0 else repr(c)


def dumps(obj: Any, **kwargs: Any) -> str:
    """``json.dumps`` of :func:`to_jsonable` (strict JSON: no NaN/Infinity tokens)."""
    return json.dumps(to_jsonable(obj), allow_nan=False, **kwargs)


__all__ = ["dumps", "nonfinite_text", "to_jsonable"]

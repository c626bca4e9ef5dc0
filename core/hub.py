"""Hugging Face Hub roots: parse ``hf://datasets/owner/name[@revision]`` and push changed files.

Reading goes through fsspec (huggingface_hub registers ``hf://``), so a hub root and a local or
``memory://`` root take the same code path; only the upload needs the hub API. The API object is
injectable so tests use a local fake and never touch the network.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from episodekit.core.words import plural

HF_URL = re.compile(r"^hf://(?:datasets/)?(?P<repo>[^/@]+/[^/@]+)(?:@(?P<rev>[^/]+))?/?$")


@dataclass(frozen=True)
class HubRoot:
    """A dataset repository on the hub, optionally at a revision."""

    repo_id: str
    revision: str | None = None


def parse_hub_root(root: str) -> HubRoot | None:
    """``hf://datasets/owner/name@rev`` -> HubRoot; None for anything else."""
    m = HF_URL.match(str(root))
    if not m:
        return None
    return HubRoot(m.group("repo"), m.group("rev"))


def is_remote(root: str) -> bool:
    """True for URLs that are not the local disk (``hf://``, ``memory://``, ``s3://``...)."""
    s = str(root)
    return "://" in s and not s.startswith("file://")


def push_files(
    local_root: str | Path,
    relpaths: Iterable[str],
    repo_id: str,
    api: Any = None,
    revision: str | None = None,
    message: str = "episodekit prepare",
) -> Any:
    """Upload ``relpaths`` (relative to ``local_root``) to a dataset repo in ONE commit.

    Returns the commit info (whatever ``api.create_commit`` returns); None when nothing changed.
    """
    from huggingface_hub import CommitOperationAdd  # noqa: PLC0415 - only needed to push

    paths = sorted(set(relpaths))
    if not paths:
        return None
    if api is None:
        from huggingface_hub import HfApi  # noqa: PLC0415

        api = HfApi()
    root = Path(local_root)
    ops = [CommitOperationAdd(path_in_repo=p, path_or_fileobj=str(root / p)) for p in paths]
    return api.create_commit(
        repo_id=repo_id,
        operations=ops,
        commit_message=f"{message}: {plural(len(ops), 'file')}",
        repo_type="dataset",
        revision=revision,
    )

"""The keys the CLI keeps in ``click.Context.meta`` (set by the shared options, read by the error
policy and the progress reporter): one module both import, so neither imports the other."""

from __future__ import annotations

DEBUG_ENV = "EPISODEKIT_DEBUG"
META_DEBUG = "episodekit.debug"
META_QUIET = "episodekit.quiet"
META_JSON = "episodekit.json"
META_ROOT = "episodekit.root"

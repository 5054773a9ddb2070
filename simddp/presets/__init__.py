"""Named, documented presets for clusters and models; each cites its source.

A preset is a plain dict of scenario keys; the config layer deep-merges the user's own keys over it,
so any preset value can be overridden. This package imports only :mod:`simddp.units`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Preset:
    """A named recipe for scenario keys, with a one-line description and its source."""

    name: str
    description: str
    source: str
    build: Callable[[], dict[str, Any]]


from simddp.presets.clusters import CLUSTER_PRESETS  # noqa: E402
from simddp.presets.models import MODEL_PRESETS  # noqa: E402

__all__ = ["CLUSTER_PRESETS", "MODEL_PRESETS", "Preset"]

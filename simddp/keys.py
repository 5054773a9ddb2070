"""Scenario keys as the pydantic models define them: the models under a field, the model at a key path,
and the closest valid key to a typo (for one-line errors that say what was meant)."""

from __future__ import annotations

import difflib
from typing import Any, get_args

from pydantic import BaseModel


def submodels(annotation: Any) -> list[type[BaseModel]]:
    """The config models inside a field's annotation (through ``X | None``, ``list[X]``, ``Annotated``)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in get_args(annotation) for m in submodels(arg)]


def model_at(root: type[BaseModel], path: list[str | int] | tuple[str | int, ...]) -> type[BaseModel] | None:
    """The model that holds the keys under ``path`` (list indices skipped), or None if the path has none."""
    model = root
    for part in path:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(part)
        found = submodels(field.annotation) if field is not None else []
        if not found:
            return None
        model = found[0]
    return model


def closest_key(key: str, valid: list[str]) -> str | None:
    """The valid key a typo most likely meant: similar spelling, else one containing it (or inside it)."""
    close = difflib.get_close_matches(key, valid, n=1, cutoff=0.6)
    if close:
        return close[0]
    contained = [v for v in valid if len(key) >= 3 and (key in v or v in key)]
    return contained[0] if contained else None


def unknown_key_message(root: type[BaseModel], loc: list[str | int] | tuple[str | int, ...]) -> str:
    """'unknown key; did you mean 'bucket_cap_mb'? (valid here: ...)' for the last part of ``loc``."""
    parent = model_at(root, loc[:-1])
    if parent is None or not loc or not isinstance(loc[-1], str):
        return "unknown key"
    valid = list(parent.model_fields)
    guess = closest_key(loc[-1], valid)
    return "unknown key" + (f"; did you mean {guess!r}?" if guess else "") + f" (valid here: {', '.join(valid)})"


__all__ = ["closest_key", "model_at", "submodels", "unknown_key_message"]

"""The scenario schema, read from the pydantic models: every key with its type, unit, default, bounds and
description (``simddp schema``), a preset's full values as pasteable YAML (``simddp presets show``), and a
starter scenario with every key commented (``simddp init``).

Nothing here is written by hand: keys, types, bounds and descriptions come from :mod:`simddp.config`, units
from the key names (``_bytes``, ``_bytes_per_s``, ``_s``, ``_mb``: the style guide puts the unit in the
name), values from the presets and the models' defaults.
"""

from __future__ import annotations

import difflib
import math
import types
from collections.abc import Callable, Iterator
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import annotated_types
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from simddp import safeio, units
from simddp.config import Cluster, ModelConfig, Scenario, ScenarioError
from simddp.keys import model_at, submodels, unknown_key_message
from simddp.presets import CLUSTER_PRESETS, MODEL_PRESETS, Preset
from simddp.scenario_io import scenario_from_dict

#: Unit of a key, from the end of its name (longest suffix first).
_UNIT_SUFFIXES: tuple[tuple[str, str], ...] = (
    ("_bytes_per_s", "bytes/s"),
    ("_flop_per_s", "FLOP/s"),
    ("_flop_per_sample", "FLOP per sample"),
    ("_numel_per_sample", "elements per sample"),
    ("_bytes", "bytes"),
    ("_bytes_per_communicator", "bytes"),
    ("_mb", "MiB"),
    ("_s", "seconds"),
    ("numel", "elements"),
    ("efficiency", "fraction of 1"),
    ("_fraction", "fraction of 1"),
)


class KeyDoc(BaseModel):
    """One scenario key: where it is, what it holds, and what it defaults to."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str = Field(description="Dotted key path; '[]' marks the items of a list.")
    type: str = Field(description="Value type: int, float, bool, str, 'one of ...', 'list of ...', or section.")
    unit: str | None = Field(description="Unit of the value (from the key name); null = none.")
    accepts_units: bool = Field(description="A string with a unit is accepted (256MiB, 25GB/s, 400Gbit/s).")
    required: bool = Field(description="The key has no default.")
    preset_sets: bool = Field(default=False, description="Every cluster preset sets it (cluster.preset fills it).")
    default: Any = Field(description="Default value (JSON); null when required or null by default.")
    nullable: bool = Field(description="null is a valid value.")
    bounds: str | None = Field(description="Bounds, e.g. '> 0', '>= 0, <= 1'; null = none.")
    description: str = Field(description="What the key means (the CLI and dashboard help text).")

    def to_text(self) -> str:
        facts = [self.type + (" or null" if self.nullable else "")]
        if self.unit:
            facts.append(self.unit + (" (accepts units: 256MiB, 80GB, 25GB/s, 400Gbit/s)" if self.accepts_units
                                      else ""))
        if self.bounds:
            facts.append(self.bounds)
        if self.required:
            facts.append("required" + (" (cluster.preset fills it)" if self.preset_sets else ""))
        elif self.type != "section":
            facts.append(f"default {_yaml_scalar(self.default)}")
        return f"{self.path}\n    {', '.join(facts)}\n    {self.description}"


def unit_of(key: str) -> str | None:
    """The unit a key's name states, or None."""
    return next((unit for suffix, unit in _UNIT_SUFFIXES if key.endswith(suffix)), None)


def human(value: Any, unit: str | None) -> str | None:
    """A value in the units people quote (GiB, GB/s, ms, TFLOP/s), or None when that adds nothing."""
    if not isinstance(value, int | float) or isinstance(value, bool) or value == 0:
        return None
    fmt: dict[str, Callable[[float], str]] = {
        "bytes": units.fmt_bytes,
        "bytes/s": units.fmt_bandwidth,
        "seconds": units.fmt_time,
        "FLOP/s": units.fmt_flop_rate,
    }
    return fmt[unit](value) if unit in fmt else None


def _strip(annotation: Any) -> tuple[Any, bool, bool]:
    """(annotation without None and Annotated, nullable, carries a unit parser)."""
    nullable = parses = False
    while True:
        origin = get_origin(annotation)
        if origin is Annotated:
            base, *extra = get_args(annotation)
            parses = parses or any(isinstance(m, BeforeValidator) for m in extra)
            annotation = base
        elif origin in (Union, types.UnionType):
            members = [a for a in get_args(annotation) if a is not type(None)]
            nullable = nullable or len(members) < len(get_args(annotation))
            if len(members) != 1:
                return Union[tuple(members)], nullable, parses  # noqa: UP007
            annotation = members[0]
        else:
            return annotation, nullable, parses


def _type_name(annotation: Any) -> str:
    annotation, _, _ = _strip(annotation)
    origin = get_origin(annotation)
    if origin is Literal:
        return "one of " + ", ".join(_yaml_scalar(a) for a in get_args(annotation))
    if origin is list:
        (item,) = get_args(annotation)
        inner = _strip(item)[0]
        name = inner.__name__ if isinstance(inner, type) and issubclass(inner, BaseModel) else _type_name(item)
        return f"list of {name}"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "section"
    return getattr(annotation, "__name__", str(annotation))


def _bounds(field: FieldInfo) -> str | None:
    ops = {annotated_types.Gt: (">", "gt"), annotated_types.Ge: (">=", "ge"), annotated_types.Lt: ("<", "lt"),
           annotated_types.Le: ("<=", "le")}
    parts = [f"{ops[type(m)][0]} {getattr(m, ops[type(m)][1])}" for m in field.metadata if type(m) in ops]
    return ", ".join(parts) or None


def _default(field: FieldInfo) -> Any:
    if field.default_factory is not None:
        value = field.default_factory()  # type: ignore[call-arg]
        return value.model_dump(mode="json") if isinstance(value, BaseModel) else value
    return None if field.default is PydanticUndefined else field.default


def _key_paths(data: dict[str, Any], prefix: str) -> set[str]:
    out = set()
    for k, v in data.items():
        out.add(prefix + k)
        if isinstance(v, dict):
            out |= _key_paths(v, prefix + k + ".")
    return out


def _cluster_preset_paths() -> set[str]:
    """Keys every cluster preset sets."""
    sets = [_key_paths(p.build(), "cluster.") for p in CLUSTER_PRESETS.values()]
    return set.intersection(*sets) if sets else set()


def _walk(model: type[BaseModel], prefix: str, from_preset: set[str]) -> Iterator[KeyDoc]:
    for name, field in model.model_fields.items():
        path = f"{prefix}{name}"
        _, nullable, parses = _strip(field.annotation)
        parses = parses or any(isinstance(m, BeforeValidator) for m in field.metadata)
        type_name = _type_name(field.annotation)
        sub = submodels(field.annotation)
        yield KeyDoc(
            path=path, type=type_name, unit=unit_of(name), accepts_units=parses, required=field.is_required(),
            default=None if type_name == "section" else _default(field), nullable=nullable,
            bounds=_bounds(field), description=field.description or "", preset_sets=path in from_preset,
        )
        if sub:
            yield from _walk(sub[0], path + ("[]." if type_name.startswith("list of") else "."), from_preset)


def schema_keys(path: str = "") -> list[KeyDoc]:
    """Every key of a scenario, or the keys at and under ``path`` ('ddp', 'cluster.inter_node', ...)."""
    keys = list(_walk(Scenario, "", _cluster_preset_paths()))
    if not path:
        return keys
    wanted = path.replace("[]", "").strip(".")
    found = [k for k in keys if (p := k.path.replace("[]", "")) == wanted or p.startswith(wanted + ".")]
    if not found:
        parts: list[str | int] = list(wanted.split("."))
        known = next((i for i in range(len(parts), 0, -1) if model_at(Scenario, parts[:i]) is not None), 0)
        bad = parts[: known + 1]
        leaf = ".".join(map(str, bad))
        if any(k.path.replace("[]", "") == leaf for k in keys):  # a value, not a section: nothing under it
            under = ".".join(map(str, parts[known + 1:]))
            raise ScenarioError(f"schema: {leaf} is a value, with no keys under it ({under})")
        raise ScenarioError(f"schema: {leaf}: {unknown_key_message(Scenario, bad)}")
    return found


# ------------------------------------------------------------------------------------------ YAML
def _yaml_scalar(value: Any) -> str:
    if isinstance(value, float) and math.isfinite(value):
        value = float(f"{value:.12g}")  # 3.4e-06, not 3.3999999999999996e-06
    text = safeio.dump_yaml(value, default_flow_style=True, width=10**9, sort_keys=False).strip()
    return text.removesuffix("...").strip()


class _Line:
    """One emitted line: indentation, the key and value, a trailing comment, commented out or not."""

    def __init__(self, indent: int, text: str, comment: str | None, off_at: int | None) -> None:
        self.indent, self.text, self.comment, self.off_at = indent, text, comment, off_at

    def render(self, column: int) -> str:
        if self.off_at is None:
            body = " " * self.indent + self.text
        else:  # "# " at the column of the outermost commented-out key: deleting it uncomments the block
            body = " " * self.off_at + "# " + " " * (self.indent - self.off_at) + self.text
        if not self.comment:
            return body
        return f"{body.ljust(column)}  # {self.comment}"


Comment = Callable[[str, FieldInfo, Any], str | None]
Active = Callable[[str], bool]


def _emit(model: type[BaseModel], values: dict[str, Any], comment: Comment, active: Active, indent: int = 0,
          prefix: str = "", off_at: int | None = None) -> list[_Line]:
    lines: list[_Line] = []
    for name, field in model.model_fields.items():
        if name not in values:
            continue
        value, path = values[name], prefix + name
        sub = submodels(field.annotation)
        on = off_at is None and active(path)
        key_off = off_at if off_at is not None else (None if on else indent)
        note = comment(path, field, value)
        if sub and isinstance(value, dict) and value:
            children = _emit(sub[0], value, comment, active, indent + 2, path + ".", key_off)
            on_children = key_off is None and any(c.off_at is None for c in children)
            head_off = None if on_children else (key_off if key_off is not None else indent)
            if head_off is not None:  # the whole section is commented out: its keys with it
                children = _emit(sub[0], value, comment, active, indent + 2, path + ".", head_off)
            lines.append(_Line(indent, f"{name}:", note, head_off))
            lines += children
        elif sub and isinstance(value, list) and value:
            lines.append(_Line(indent, f"{name}:", note, key_off))
            lines += [_Line(indent + 2, f"- {_yaml_scalar(item)}", None, key_off) for item in value]
        else:
            lines.append(_Line(indent, f"{name}: {_yaml_scalar(value)}", note, key_off))
    return lines


def _render(lines: list[_Line]) -> str:
    column = min(56, max((len(ln.render(0)) for ln in lines if ln.comment), default=0))
    return "\n".join(ln.render(column) for ln in lines)


def _human_comment(path: str, field: FieldInfo, value: Any) -> str | None:
    key = path.rsplit(".", 1)[-1]
    shown = human(value, unit_of(key))
    if shown and key.startswith("nic_"):  # NICs are quoted in Gbit/s
        shown += f" = {value / units.GBIT:g} Gbit/s"
    return shown


def _described(path: str, field: FieldInfo, value: Any) -> str | None:
    shown = _human_comment(path, field, value)
    bounds = _bounds(field)
    extra = "; ".join(x for x in (shown, bounds) if x)
    return (field.description or "") + (f" [{extra}]" if extra else "")


# ------------------------------------------------------------------------------------------ presets
def find_preset(name: str) -> tuple[str, Preset]:
    """('cluster' or 'model', the preset); an unknown name gets the closest one and the list."""
    for section, presets in (("cluster", CLUSTER_PRESETS), ("model", MODEL_PRESETS)):
        if name in presets:
            return section, presets[name]
    every = [*CLUSTER_PRESETS, *MODEL_PRESETS]
    guess = difflib.get_close_matches(name, every, n=1, cutoff=0.5)
    raise ScenarioError(f"unknown preset {name!r}" + (f"; did you mean {guess[0]!r}?" if guess else "")
                        + f" (clusters: {', '.join(CLUSTER_PRESETS)}; models: {', '.join(MODEL_PRESETS)})")


def preset_values(name: str) -> tuple[str, dict[str, Any]]:
    """A preset's complete values (every key, defaults included), without the ``preset`` key itself."""
    section, _ = find_preset(name)
    model: type[Cluster] | type[ModelConfig] = Cluster if section == "cluster" else ModelConfig
    values = model.model_validate({"preset": name}).model_dump(mode="json", exclude={"preset"}, exclude_none=True)
    return section, values


def preset_yaml(name: str) -> str:
    """The preset as a scenario section, every value spelled out: paste it into a scenario and edit."""
    section, preset = find_preset(name)
    _, values = preset_values(name)
    model = Cluster if section == "cluster" else ModelConfig
    head = [f"# {name}: {preset.description}", f"# source: {preset.source}",
            f"# Every value of the preset; in a scenario, `{section}: {{preset: {name}}}` plus the keys you change "
            "is the same."]
    body = _emit(model, values, _human_comment, lambda _: True, indent=2, prefix=f"{section}.")
    return "\n".join([*head, f"{section}:", _render(body)]) + "\n"


# ------------------------------------------------------------------------------------------ init
def _fit_batch(data: dict[str, Any]) -> str | None:
    """Raise the base's global batch to the next multiple of dp x micro_batch_size where the cluster chosen does
    not divide it (the default's 512 samples on 3 nodes of 8 GPUs: dp 24, 528), keeping the samples per GPU
    nearest the base's; say so, or None where it divides."""
    training = data.get("training", {})
    batch = training.get("global_batch_size")
    if batch is None:
        return None
    sized = scenario_from_dict({**data, "training": {**training, "global_batch_size": None}})
    per_step = sized.dp * sized.training.micro_batch_size
    if batch % per_step == 0:
        return None
    raised = -(-batch // per_step) * per_step
    data["training"] = {**training, "global_batch_size": raised}
    return (f"training.global_batch_size: {raised:,}, the base's {batch:,} raised to a multiple of dp x "
            f"micro_batch_size ({sized.dp:,} x {sized.training.micro_batch_size})")


def _fit_seq_len(data: dict[str, Any]) -> None:
    """Lower the base's sequence length to the model's learned position table where it is longer (GPT-2's 1,024
    positions against the default's 4,096 tokens): a scenario refuses a sequence the model cannot embed."""
    from simddp.config import ModelConfig

    tf = ModelConfig.model_validate(data["model"]).transformer
    training = data.get("training", {})
    seq = training.get("seq_len")
    if tf is not None and tf.position_embedding == "learned" and seq is not None and seq > tf.max_position_embeddings:
        data["training"] = {**training, "seq_len": tf.max_position_embeddings}


def starter_scenario(base: dict[str, Any], model: str | None, cluster: str | None,
                     num_nodes: int | None) -> str:
    """A starter scenario with every key, each with its description.

    The keys of ``base`` (the embedded default), with the model and cluster swapped in, are live (a model
    that is not a transformer gets ``seq_len: 1``); every other key is commented out showing the value it
    takes (the preset's or the default), so uncommenting a line changes nothing until the value is edited.
    """
    data = dict(base)
    if model is not None:
        find_preset(model)
        data["model"] = {"preset": model}
    if cluster is not None:
        find_preset(cluster)
        data["cluster"] = {**data.get("cluster", {}), "preset": cluster}
    if num_nodes is not None:
        data["cluster"] = {**data.get("cluster", {}), "num_nodes": num_nodes}
    _fit_seq_len(data)
    note = _fit_batch(data)
    scenario = scenario_from_dict(data)
    if scenario.model.transformer is None and scenario.training.seq_len != 1:  # a CNN sample is one image
        data["training"] = {**data.get("training", {}), "seq_len": 1}
        scenario = scenario_from_dict(data)
    full = scenario.model_dump(mode="json")
    full["name"] = scenario.name
    # the model alternatives a preset does not use are left out; other keys whose default is null stay
    full["model"] = {k: v for k, v in full["model"].items() if v is not None or k not in ("transformer", "parameters")}
    live = _key_paths(data, "")

    def comment(path: str, field: FieldInfo, value: Any) -> str | None:
        text = _described(path, field, value)
        if path in ("model.transformer", "model.parameters") and "model.preset" in live:
            text = f"{text} To change it, delete model.preset and uncomment this."
        return text

    body = _emit(Scenario, full, comment, lambda p: p in live)
    head = [
        f"# A simddp scenario: {scenario.name}. Generated by `simddp init`; every key is listed with what it means.",
        "# Commented-out keys show the value they take (the preset's or the default): uncomment one to change it.",
        "# `simddp schema KEY` explains a key; `simddp presets show NAME` prints a preset's values. Sizes and rates",
        "# accept units: 80GiB (binary), 80GB (decimal), 25GB/s, 400Gbit/s; a bare number is bytes or bytes/s.",
        *([f"# {note}"] if note else []),
    ]
    return "\n".join([*head, _render(body)]) + "\n"


__all__ = ["KeyDoc", "find_preset", "human", "preset_values", "preset_yaml", "schema_keys", "starter_scenario",
           "unit_of"]

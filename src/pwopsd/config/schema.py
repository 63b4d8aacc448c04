"""The config schema (``workflow/schemas/config.schema.yaml``, JSON Schema draft 2020-12): reading
it, filling a config's omitted keys with its defaults, and the error a config that breaks it raises.
The schema is the only place defaults live."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

SCHEMA_PATH = Path(__file__).resolve().parents[3] / "workflow" / "schemas" / "config.schema.yaml"


class ConfigError(ValueError):
    """The configuration is invalid; the message lists every problem with its key."""


# libyaml's parser where PyYAML has it (every Snakemake start reads the schema: ~10x faster).
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_schema(path: str | Path | None = None) -> dict:
    with open(path or SCHEMA_PATH) as fh:
        return yaml.load(fh, Loader=SAFE_LOADER)  # noqa: S506 - a safe loader


def ref_target(ref: str, root: dict) -> dict:
    """The part of the schema ``root`` a local ``$ref`` (``#/$defs/model``) points at."""
    assert ref.startswith("#/"), ref
    target = root
    for part in ref[2:].split("/"):
        target = target[part]
    return target


def branch_applies(sub: dict, instance: Any) -> bool:
    """Whether an ``allOf`` member ``{if: {properties: {<key>: {const: <value>}}}, then: ...}``
    (source kind, loss) applies to ``instance``."""
    cond = sub.get("if")
    if cond is None or not isinstance(instance, dict):
        return False
    consts = {k: v["const"] for k, v in cond.get("properties", {}).items() if isinstance(v, dict) and "const" in v}
    return bool(consts) and all(instance.get(k) == v for k, v in consts.items())


def fill_defaults(instance: Any, schema: dict, root: dict) -> None:
    """Insert ``default`` values of the schema into ``instance`` (in place), recursively."""
    if "$ref" in schema:
        fill_defaults(instance, ref_target(schema["$ref"], root), root)
    if not isinstance(instance, dict):
        return
    for name, sub in schema.get("properties", {}).items():
        if not isinstance(sub, dict):
            continue
        if name not in instance and "default" in sub:
            instance[name] = copy.deepcopy(sub["default"])
        if name in instance:
            fill_defaults(instance[name], sub, root)
    extra = schema.get("additionalProperties")
    if isinstance(extra, dict):
        for name, value in instance.items():
            if name not in schema.get("properties", {}):
                fill_defaults(value, extra, root)
    # `if: {properties: {<key>: {const: <value>}}}` branches (source kind, loss): fill the matching
    # branch's defaults, after the plain properties so that a branch finds their defaults in place
    # (a method given without `params` gets its loss's parameter defaults).
    for sub in schema.get("allOf", []):
        if branch_applies(sub, instance):
            fill_defaults(instance, sub.get("then", {}), root)


def schema_defaults(section: str, entry: dict | None = None) -> dict:
    """A config section as the schema fills it: ``training`` or a ``methods`` entry (give at least
    its ``loss``), with every omitted key at its schema default. The schema is the only place
    defaults live; tools and tests that need "the paper's setting" ask it here."""
    schema = load_schema()
    sub = schema["properties"][section]
    if section == "methods":
        sub = sub["additionalProperties"]
    filled = copy.deepcopy(entry or {})
    fill_defaults(filled, sub, schema)
    return filled

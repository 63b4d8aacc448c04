"""Typed ``--config`` overrides. Snakemake reads a nested value given on the command line with YAML's base
loader, so every leaf arrives as a string (`--config 'evaluation={n: 3}'` gives n = '3'). Each
leaf given there is typed by the schema at its key before validation: it takes what it would mean
in a config file (its YAML reading, or a number reading: YAML 1.1 reads 5e-6 as a string) when the
schema accepts that, else it stays a string when the schema accepts one (a revision "1234"). A
value of the right type but out of range takes that type, so that validation names the bound;
what no type fits stays as given and validation names the key.
"""

from __future__ import annotations

from typing import Any

import yaml

from pwopsd.config.schema import branch_applies, load_schema, ref_target

_JSON_TYPES = ((bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"), (list, "array"),
               (dict, "object"), (type(None), "null"))


def _json_type(value: Any) -> str:
    return next(name for cls, name in _JSON_TYPES if isinstance(value, cls))


def _resolve(schema: dict, root: dict) -> dict:
    while "$ref" in schema:
        schema = {**{k: v for k, v in schema.items() if k != "$ref"}, **ref_target(schema["$ref"], root)}
    return schema


def _applicable(schema: dict, root: dict, instance: Any) -> list[dict]:
    """The schema of a node and every ``allOf`` member or ``if``/``then`` branch that applies to
    ``instance`` (a method's ``params`` are declared in the branch of its loss)."""
    out, todo = [], [schema]
    while todo:
        node = _resolve(todo.pop(), root)
        out.append(node)
        for sub in node.get("allOf", []):
            if "if" not in sub:
                todo.append(sub)
            elif branch_applies(sub, instance):
                todo.append(sub.get("then", {}))
    return out


def _child_schemas(schemas: list[dict], key: str) -> list[dict]:
    import re

    out = []
    for node in schemas:
        if key in node.get("properties", {}):
            out.append(node["properties"][key])
        elif any(re.search(p, key) for p in node.get("patternProperties", {})):
            out += [s for p, s in node["patternProperties"].items() if re.search(p, key)]
        elif isinstance(node.get("additionalProperties"), dict):
            out.append(node["additionalProperties"])
    return [s for s in out if isinstance(s, dict)]  # `true` accepts anything


def _allowed_types(schema: dict, root: dict) -> set[str]:
    schema = _resolve(schema, root)
    kinds = schema.get("type")
    out = set([kinds] if isinstance(kinds, str) else kinds or [])
    out |= {_json_type(v) for v in ([schema["const"]] if "const" in schema else []) + list(schema.get("enum", []))}
    for key in ("anyOf", "oneOf"):
        for sub in schema.get(key, []):
            out |= _allowed_types(sub, root)
    return out


def _readings(text: str) -> list[Any]:
    """What a command-line string may mean, most specific first."""
    out = []
    try:
        out.append(yaml.safe_load(text))
    except yaml.YAMLError:
        pass
    for parse in (int, float):
        try:
            out.append(parse(text))
        except ValueError:
            pass
    return [v for v in out if not isinstance(v, str)]


_VALIDATORS: dict[tuple[int, int], tuple[dict, dict, Any]] = {}


def _validator(schema: dict, root: dict):
    """A validator of ``schema`` (a part of ``root``, whose ``$defs`` it may refer to), built once."""
    from jsonschema import Draft202012Validator

    key = (id(schema), id(root))
    if key not in _VALIDATORS:  # the schemas are kept with it, so that their ids stay theirs
        _VALIDATORS[key] = (schema, root, Draft202012Validator({"$defs": root.get("$defs", {}), **schema}))
    return _VALIDATORS[key][2]


def _typed_leaf(text: str, schemas: list[dict], root: dict) -> Any:
    def valid(value):
        return all(_validator(s, root).is_valid(value) for s in schemas)

    if not schemas:
        return text
    readings = _readings(text)
    for value in readings + [text]:  # what it would mean in a config file, if the schema allows it
        if valid(value):
            return value
    allowed = [t for t in (_allowed_types(s, root) for s in schemas) if t]
    for value in readings:  # the right type but out of range: validation names the key and the bound
        kind = _json_type(value)
        if all(kind in t or (kind == "integer" and "number" in t) for t in allowed):
            return value
    return text


def _typed(value: Any, schemas: list[dict], current: Any, root: dict) -> Any:
    if isinstance(value, str):
        return _typed_leaf(value, schemas, root)
    if isinstance(value, list):
        items = [s["items"] for s in (_resolve(s, root) for s in schemas) if isinstance(s.get("items"), dict)]
        return [_typed(v, items, None, root) for v in value]
    if isinstance(value, dict):
        scope = current if isinstance(current, dict) else value
        nodes = [n for s in schemas for n in _applicable(s, root, scope)]
        return {k: _typed(v, _child_schemas(nodes, k), scope.get(k), root) for k, v in value.items()}
    return value


def typed_overrides(config: dict, overrides: dict, schema: dict | None = None) -> dict:
    """The command line's ``--config`` values (``overrides``) typed by the schema at their keys;
    ``config`` (the config files merged with them, as Snakemake hands it over) decides which
    branch of the schema applies (a method's loss). Merged into ``config`` they replace the
    untyped values; only command-line values change (a quoted string in a config file stays one)."""
    from pwopsd.config.validation import removable_sections

    schema = schema or load_schema()
    typed = _typed(dict(overrides), [schema], config, schema)
    # `--config 'benchmarks={hmmt_feb2025: null}'` removes the entry, as null in an overlay file does
    # (the schema has no null there, so the value would stay the string 'null')
    for entries in removable_sections(typed):
        for name, value in entries.items():
            if isinstance(value, str) and _readings(value) == [None]:  # YAML's null, as in a config file
                entries[name] = None
    return typed


def dotted_overrides(pairs: list[str], config: dict) -> dict:
    """``["training.lr=3e-3", ...]`` (a benchmark's ``--set``) as one nested mapping, each value
    typed by the schema at its key as ``snakemake --config`` values are (:func:`typed_overrides`);
    ``config`` is what they go over."""
    from pwopsd.config.files import merge_configs

    raw: dict = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"{pair!r}: expected KEY.PATH=VALUE")
        *parents, leaf = key.split(".")
        node = raw
        for k in parents:
            node = node.setdefault(k, {})
        node[leaf] = value
    return typed_overrides(merge_configs(config, raw), raw)


def flat_items(mapping, sep: str = ".", prefix: str = ""):
    """``(key path, value)`` of each leaf of nested mappings (an empty mapping is a leaf), the path
    joined with ``sep``."""
    from collections.abc import Mapping

    for key, value in mapping.items():
        if isinstance(value, Mapping) and value:
            yield from flat_items(value, sep, f"{prefix}{key}{sep}")
        else:
            yield f"{prefix}{key}", value


def override_lines(overrides: dict) -> list[str]:
    """``key.path = value`` for each leaf of (typed) ``--config`` overrides, for the run's log."""
    return [f"{key} = {value!r}" for key, value in flat_items(overrides)]


# ----------------------------------------------------------------------------------------------
# Helpers used by rules (pure functions of a validated config).

"""Reading config files: YAML that refuses a key given twice, overlays merged as Snakemake merges
``--configfile`` files, the result validated."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from pwopsd.config.schema import SAFE_LOADER, ConfigError
from pwopsd.config.validation import validate_config


class _UniqueKeyLoader(SAFE_LOADER):
    """A YAML loader that refuses a key given twice in one mapping (plain YAML keeps the last one,
    so a second ``qwen3_4b:`` would silently replace the first)."""


def _unique_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        line = key_node.start_mark.line + 1
        if key in seen:
            raise ConfigError(f"config file {key_node.start_mark.name}, line {line}: duplicate key {key!r} "
                              f"(first given at line {seen[key]}); YAML would silently keep only the last one")
        seen[key] = line
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_mapping)


def read_yaml_strict(path: str | Path) -> Any:
    """Parse a YAML config file, rejecting duplicate keys with their line numbers."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"config file {path} does not exist")
    with open(path) as fh:
        try:
            return yaml.load(fh, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {path} is not valid YAML: {exc}") from None


def load_config(path: str | Path) -> dict:
    return validate_config(read_yaml_strict(path) or {})


def merge_configs(base: dict, overlay: dict) -> dict:
    """``overlay`` merged into a copy of ``base`` as Snakemake merges ``--configfile`` files:
    mappings key by key, recursively; any other value replaced. One exception: a data ``source``
    of another ``kind`` replaces the base's source whole (an overlay that moves MATH-500 from the
    Hub to a local file must not keep the Hub source's ``dataset`` and ``revision``)."""
    out = copy.deepcopy(base)
    for key, value in overlay.items():
        old = out.get(key)
        if isinstance(value, dict) and isinstance(old, dict) and not _replaces_source(key, old, value):
            out[key] = merge_configs(old, value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _replaces_source(key: str, old: dict, new: dict) -> bool:
    return key == "source" and "kind" in new and new["kind"] != old.get("kind")


def merge_config_files(paths) -> dict:
    """Config files read strictly and merged in order (:func:`merge_configs`), not validated."""
    merged: dict = {}
    for path in paths:
        merged = merge_configs(merged, read_yaml_strict(path) or {})
    return merged


def load_config_files(paths) -> dict:
    """The validated config of a run with several config files (the workflow's, then overlays)."""
    merged = merge_config_files(paths)
    return validate_config(merged)

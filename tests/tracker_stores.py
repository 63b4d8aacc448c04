"""Read back what a tracker stored locally, independently of pwopsd.tracking: W&B offline run files
(`<directory>/wandb/offline-run-*/run-<id>.wandb`, a LevelDB-log of protobuf records, read here
block by block) and an MLflow SQLite store (through MLflow's own client)."""

import json
import struct
from pathlib import Path

BLOCK, HEADER = 32768, 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def _records(path: Path):
    data = path.read_bytes()
    ident, magic, _version = struct.unpack("<4sHB", data[:HEADER])
    assert ident == b":W&B" and magic == 0xBEE1, (path, ident, magic)
    pos, pending = HEADER, b""
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:  # the block's tail is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + HEADER])
        if length == 0 and kind == 0:
            pos += left
            continue
        chunk = data[pos + HEADER:pos + HEADER + length]
        pos += HEADER + length
        if kind == FULL:
            yield chunk
        elif kind == FIRST:
            pending = chunk
        elif kind == MIDDLE:
            pending += chunk
        elif kind == LAST:
            yield pending + chunk
            pending = b""


def wandb_offline_runs(directory) -> dict[str, dict]:
    """run id -> {"name", "group", "job_type", "config", "history": [(step, metrics)]}, over every
    offline run folder of that id (a resumed job writes a second folder)."""
    from wandb.proto import wandb_internal_pb2 as pb

    runs: dict[str, dict] = {}
    for path in sorted(Path(directory).glob("wandb/offline-run-*/run-*.wandb")):
        current = None
        for data in _records(path):
            rec = pb.Record()
            rec.ParseFromString(data)
            kind = rec.WhichOneof("record_type")
            if kind == "run":
                current = runs.setdefault(rec.run.run_id, {"history": [], "config": {}})
                current.update(name=rec.run.display_name, group=rec.run.run_group, job_type=rec.run.job_type)
                current["config"].update({i.key: json.loads(i.value_json) for i in rec.run.config.update if i.key != "_wandb"})
            elif kind == "config" and current is not None:
                current["config"].update({i.key: json.loads(i.value_json) for i in rec.config.update if i.key != "_wandb"})
            elif kind == "history" and current is not None:
                values = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.history.item}
                step = values.pop("_step")
                current["history"].append((step, {k: v for k, v in values.items() if not k.startswith("_")}))
    return runs


def mlflow_runs(directory, project="pwopsd-repro") -> dict[str, dict]:
    """pwopsd run id -> {"name", "params", "history": [(step, metrics)]} of an MLflow SQLite store."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{Path(directory).resolve() / 'mlflow.db'}")
    exp = client.get_experiment_by_name(project)
    out = {}
    for run in client.search_runs([exp.experiment_id], max_results=1000):
        by_step: dict[int, dict] = {}
        points = 0
        for key in run.data.metrics:
            for m in client.get_metric_history(run.info.run_id, key):
                by_step.setdefault(m.step, {})[key] = m.value
                points += 1
        out[run.data.tags["pwopsd.run_id"]] = {"name": run.info.run_name, "params": run.data.params, "points": points,
                                               "history": sorted(by_step.items()), "status": run.info.status}
    return out

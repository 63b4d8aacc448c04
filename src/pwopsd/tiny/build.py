"""The ``build_tiny_model`` rule's logic: tokenizer -> model -> pretraining -> dev check -> save."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from pwopsd.io import atomic_path, write_json
from pwopsd.runtime import versions
from pwopsd.tiny.model import (
    TinyBuildConfig,
    TinyModelCheckError,
    build_model,
    check_dev_accuracy,
    dev_accuracy,
    pretrain,
    tiny_tokenizer,
)

log = logging.getLogger(__name__)


def build_tiny_model(*, name: str, settings: dict, model_dir: str, manifest_path: str, report_path: str) -> dict:
    cfg = TinyBuildConfig.from_dict(settings)
    t0 = time.time()
    tokenizer = tiny_tokenizer(cfg)
    model = build_model(cfg, tokenizer)
    n_params = sum(p.numel() for p in model.parameters())
    log.info("tiny model %s: %d parameters, vocabulary %d", name, n_params, len(tokenizer))
    losses = pretrain(model, tokenizer, cfg)
    t_train = time.time() - t0
    acc = dev_accuracy(model, tokenizer, cfg)
    t_total = time.time() - t0
    report = {
        "model": name,
        "parameters": n_params,
        "vocab_size": len(tokenizer),
        "settings": cfg.__dict__,
        "final_loss": sum(losses[-20:]) / min(20, len(losses)),
        "dev_accuracy": acc,
        "teacher_gap": acc["teacher"]["mean"] - acc["student"]["mean"],
        "seconds_pretrain": round(t_train, 1),
        "seconds_total": round(t_total, 1),
        "versions": versions(),
    }
    log.info("dev accuracy %s", acc)
    problems = check_dev_accuracy(acc, cfg)
    if problems:
        raise TinyModelCheckError("tiny model failed its build check:\n  - " + "\n  - ".join(problems))
    with atomic_path(model_dir) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    manifest = {
        "model": name,
        "kind": "tiny",
        "path": str(Path(model_dir)),
        "parameters": n_params,
        "settings": cfg.__dict__,
    }
    write_json(report, report_path)
    write_json(manifest, manifest_path)
    return report

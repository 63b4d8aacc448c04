"""The ``build_tiny_model`` rule's logic: tokenizer -> model -> pretraining until the dev check passes -> save."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from pwopsd.io import atomic_path, write_json
from pwopsd.keys import folder_content_sha256
from pwopsd.runtime import kernel_path_provenance, versions
from pwopsd.tiny.examples import TinyBuildConfig, tiny_tokenizer
from pwopsd.tiny.model import FINGERPRINT_STEPS, TinyModelCheckError, build_model, not_ready_message, pretrain

log = logging.getLogger(__name__)


def build_tiny_model(*, name: str, settings: dict, model_dir: str, manifest_path: str, report_path: str) -> dict:
    cfg = TinyBuildConfig.from_dict(settings)
    t0 = time.time()
    tokenizer = tiny_tokenizer(cfg)
    model = build_model(cfg, tokenizer)
    n_params = sum(p.numel() for p in model.parameters())
    log.info("tiny model %s: %d parameters, vocabulary %d", name, n_params, len(tokenizer))
    result = pretrain(model, tokenizer, cfg)
    t_total = time.time() - t0
    losses = result.losses
    report = {
        "model": name,
        "parameters": n_params,
        "vocab_size": len(tokenizer),
        "settings": cfg.__dict__,
        "pretraining_steps": result.steps,
        "final_loss": sum(losses[-20:]) / min(20, len(losses)),
        "dev_checks": result.checks,
        "dev_accuracy": result.dev_accuracy,
        "teacher_gap": result.dev_accuracy["teacher"]["mean"] - result.dev_accuracy["student"]["mean"] if result.dev_accuracy else None,
        # The weights after the first steps (pwopsd.tiny.model.weights_fingerprint) as an integer, so
        # that the digest, which keeps numbers only, holds it: a new host's first check.
        "first_steps": {"steps": FINGERPRINT_STEPS,
                        "fingerprint": int(result.first_steps, 16) if result.first_steps else None},
        "seconds_total": round(t_total, 1),
        "versions": versions(),
        **kernel_path_provenance(),  # cpu_capability (torch's path), pinned_kernel_path, mkl_cbwr
    }
    if result.dev_accuracy is None:
        raise TinyModelCheckError("tiny model failed its build check:\n  - " + not_ready_message(result, cfg))
    log.info("ready after %d steps: dev accuracy %s", result.steps, result.dev_accuracy)
    with atomic_path(model_dir) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    manifest = {
        "model": name,
        "kind": "tiny",
        "path": str(Path(model_dir)),
        "parameters": n_params,
        "settings": cfg.__dict__,
        "content_sha256": folder_content_sha256(model_dir),  # pwopsd.keys.weights_identity
    }
    write_json(report, report_path)
    write_json(manifest, manifest_path)
    return report

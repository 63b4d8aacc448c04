"""Preflight: what a new cluster must offer before the paper run spends GPU-hours, checked in
minutes, each failure naming the setting to change (issue 52; docs/cluster.md, "Your first hour on a
new cluster").

    python -m pwopsd.preflight                  # on the login node: profile, Slurm, conda, engines, sync folder
    python -m pwopsd.preflight --gpu-job        # and one short job on a GPU node: its driver against each environment
    python -m pwopsd.preflight node             # what that job runs (the node's driver, GPUs, CUDA)

Checks, each a small function of what it reads (so that tests feed it a rejected GRES name, a fake
driver version or an 8B model's KV need):

* the profile: no ``CHANGE_ME`` left (account, partitions, the GPU type), a software deployment
  method, and conda on the PATH;
* Slurm: each partition exists, its time limit holds ``cluster.max_runtime_min``, and sbatch
  accepts each GPU rule's request (``sbatch --test-only --gpus=<gpu_model>:<n>``), which is how a
  GRES type the site spells otherwise (``nvidia_h100_80gb_hbm3``) shows before any job, then each
  rule's whole request (CPUs, memory, time and GPUs at its first attempt): nodes smaller than the
  profile's sizes;
* each vLLM engine of each model (evaluation, diagnostic, the colocated rollout engine): its weights
  and the KV cache of one full-length sequence (from the model's ``config.json``) within its share
  of ``cluster.gpu_memory_gib``;
* the rollout sync folder: free space for the merged weights of every rank, and its write speed
  (a node-local folder such as ``$TMPDIR``: on the GPU node, by ``--gpu-job``);
* on a GPU node (``--gpu-job``): the NVIDIA driver against the CUDA runtime of each ``envs/*.yaml``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from pwopsd.cluster import PLACEHOLDER, job_sizes, profile_text, resources_key

REPO = Path(__file__).resolve().parents[2]
GPU_RULE_STAGE = {"generate": "generate", "generate_sweep_step": "generate", "spines": "generate",
                  "forced_continuation": "generate", "train": "train", "teacher_pass": "forward", "mc_dropout": "forward"}
JOB_ENVS = ("envs/train.yaml", "envs/vllm.yaml")
# What a vLLM engine holds besides weights and KV cache: the CUDA context, activations of its profile
# run, sampler buffers (vLLM's docs: a few GiB at 4-8k batched tokens). An estimate until the first
# lent GPU measures it (tools/gpu_check.py).
ENGINE_OVERHEAD_GIB = 2.0
GIB = 2**30


@dataclass
class Finding:
    check: str
    ok: bool
    message: str
    setting: str = ""   # what to change when it fails
    warn: bool = False  # a failure that costs time, not the run: reported, not counted


# -- the profile and Slurm ------------------------------------------------------------------------

def profile_findings(profile: dict, which=shutil.which) -> list[Finding]:
    """Placeholders, the software deployment method and conda."""
    from pwopsd.cluster import placeholder_problems

    per_rule = {r: dict(v or {}) for r, v in (profile.get("set-resources") or {}).items()}
    keys: dict[str, list[str]] = {}  # a placeholder -> the keys holding it (an anchor's value is in many)
    for p in placeholder_problems(dict(profile.get("default-resources") or {}), per_rule):
        key, value = p.split(": ")[1].split(" is ")
        keys.setdefault(value, []).append(key)
    out = [Finding("profile", False, f"{value} is still set at {', '.join(where)}: set it for your cluster "
                   "(profiles/slurm/profile.yaml, once where its anchor & is)",
                   min(where, key=lambda k: (".generate." not in k, k)))  # the GPU anchors are set at generate
           for value, where in keys.items()]
    sdm = profile.get("software-deployment-method") or []
    sdm = [sdm] if isinstance(sdm, str) else list(sdm)
    if "conda" not in sdm:
        out.append(Finding("software", False, "the profile sets no software-deployment-method: conda: every job would run "
                           "in Snakemake's own environment, which has no torch or vLLM", "software-deployment-method"))
    elif not (which("conda") or which("mamba")):
        out.append(Finding("software", False, "software-deployment-method is conda but neither conda nor mamba is on the "
                           "PATH of this node (Miniforge: docs/cluster.md)", "PATH"))
    else:
        out.append(Finding("software", True, f"conda environments ({which('conda') or which('mamba')})"))
    return out or [Finding("profile", True, "no CHANGE_ME left")]


def limit_minutes(text: str) -> float:
    """A Slurm time limit (``infinite``, ``2-00:00:00``, ``1:00:00``, ``30:00``, ``30``) in minutes;
    also a duration as ``sacct`` prints one, its seconds with a fraction (``TotalCPU``: ``01:02.345``)."""
    text = text.strip()
    if text in ("infinite", "UNLIMITED"):
        return float("inf")
    days, _, rest = text.rpartition("-")
    parts = [float(p) for p in rest.split(":")]
    h, m, s = ([0] * (3 - len(parts)) + parts) if len(parts) > 1 else (0, parts[0], 0)
    return (int(days or 0) * 24 + h) * 60 + m + s / 60


def partitions(sinfo_text: str) -> dict[str, dict]:
    """``sinfo -h -o '%P|%l|%G'`` as partition -> {limit_min, gres: set of GPU types}."""
    out: dict[str, dict] = {}
    for line in sinfo_text.splitlines():
        if line.count("|") != 2:
            continue
        name, limit, gres = line.split("|")
        part = out.setdefault(name.rstrip("*"), {"limit_min": limit_minutes(limit), "gres": set()})
        part["gres"] |= {m.group(1) for m in re.finditer(r"gpu:([^:,(]+):\d+", gres)}
    return out


def profile_account(profile: dict) -> str:
    """The account jobs are charged to ('' where unset or still a placeholder: Slurm's default)."""
    account = profile_text(profile.get("default-resources") or {}, "slurm_account")
    return "" if PLACEHOLDER in account else account


def gpu_requests(profile: dict, cfg: dict) -> list[tuple[str, str, str, int]]:
    """``(rule, partition, gpu_model, gpus)`` of each GPU rule: the most GPUs any model asks for."""
    out = []
    for rule, res in (profile.get("set-resources") or {}).items():
        res = res or {}
        if rule in GPU_RULE_STAGE and "gpu_model" in res:
            gpus = max(int(m["gpus"][GPU_RULE_STAGE[rule]]) for m in cfg["models"].values())
            if gpus:
                out.append((rule, profile_text(res, "slurm_partition"), profile_text(res, "gpu_model"), gpus))
    return out


def slurm_findings(profile: dict, cfg: dict, run=subprocess.run, env: dict | None = None) -> list[Finding]:
    """Partitions, their time limits, and sbatch's answer to each GPU request (``--test-only``)."""
    if not shutil.which("sbatch", path=(env or os.environ).get("PATH")):
        return [Finding("slurm", False, "no sbatch on this node: run the preflight on a login node of the cluster", "PATH")]
    info = run(["sinfo", "-h", "-o", "%P|%l|%G"], capture_output=True, text=True, env=env)
    if info.returncode != 0:
        return [Finding("slurm", False, f"sinfo failed: {' '.join(info.stderr.split())[-300:]}", "SLURM_CONF / the login node")]
    parts = partitions(info.stdout)
    defaults = profile.get("default-resources") or {}
    used = {profile_text(defaults, "slurm_partition")} | {p for _, p, _, _ in gpu_requests(profile, cfg)}
    out, cap = [], cfg["cluster"]["max_runtime_min"]
    for name in sorted(p for p in used if p and PLACEHOLDER not in p):
        if name not in parts:
            out.append(Finding("partition", False, f"partition {name} does not exist here (sinfo: {', '.join(parts)})",
                               "profiles/slurm/profile.yaml: slurm_partition"))
        elif parts[name]["limit_min"] < cap:
            out.append(Finding("time limit", False, f"partition {name} allows {parts[name]['limit_min']:.0f} min, "
                               f"cluster.max_runtime_min is {cap}: jobs would be refused or killed", "cluster.max_runtime_min"))
        else:
            out.append(Finding("partition", True, f"{name}: limit {parts[name]['limit_min']:.0f} min >= {cap}"))
    account = profile_account(profile)
    test = ["sbatch", "--test-only", *(["--account", account] if account else [])]

    def refusal(args: list[str]) -> str:
        proc = run([*test, *args, "--wrap", "true"], capture_output=True, text=True, env=env)
        return " ".join((proc.stderr + proc.stdout).split())[-300:] if proc.returncode != 0 else ""

    gres, unchecked = {}, set()  # rule: its accepted --gpus; rules whose GPU request was not accepted
    for rule, part, model, gpus in gpu_requests(profile, cfg):
        unchecked.add(rule)
        if PLACEHOLDER in part + model:
            continue  # named by the profile check
        said = refusal(["-p", part, f"--gpus={model}:{gpus}", "--time", "10"])
        types = sorted(parts.get(part, {}).get("gres", set()))
        if said:
            out.append(Finding("GRES", False, f"sbatch refuses rule {rule}'s request --gpus={model}:{gpus} in partition "
                               f"{part} ({said}); the partition's GPU types: {', '.join(types) or 'none'}",
                               f"profiles/slurm/profile.yaml: set-resources.{rule}.gpu_model (and models.<model>.gpus)"))
        else:
            gres[rule] = f"--gpus={model}:{gpus}"
            unchecked.discard(rule)
            out.append(Finding("GRES", True, f"rule {rule}: --gpus={model}:{gpus} accepted in {part}"))
    # Each rule's whole request as its jobs will ask (CPUs, memory, time at the first attempt, and the
    # GPUs sbatch accepted above): a node smaller than the profile's sizes refuses it here, not after
    # the queue wait of the first job. A partition (or account) that refuses a bare 10-minute job is
    # named once as that, not as every rule's size.
    sizes, unread = job_sizes(profile, cfg["cluster"]["max_runtime_min"])
    for rule, why in unread.items():
        out.append(Finding("job size", False, f"rule {rule}'s request is not checked: {why}", warn=True,
                           setting=f"profiles/slurm/profile.yaml: {resources_key(rule)}"))
    def named_above(part: str) -> bool:  # a placeholder, or a partition sinfo lacks
        return PLACEHOLDER in part or bool(part) and part not in parts

    refused_partitions: dict[str, str] = {}
    for part in sorted({size["partition"] for size in sizes.values()}):
        if named_above(part):
            continue
        if said := refusal([*(["-p", part] if part else []), "--time", "10"]):
            refused_partitions[part] = said
            out.append(Finding("partition", False, f"sbatch refuses a 10-minute job in partition {part or '(the default)'} "
                               f"with account {account or '(the default)'}: {said}",
                               "profiles/slurm/profile.yaml: slurm_partition / slurm_account"))
    for rule, size in sizes.items():
        part = size["partition"]
        if named_above(part) or part in refused_partitions or rule in unchecked:
            continue  # its partition, or its GPU request, is named above
        what = f"{size['cpus']} CPUs, {size['mem_mb']} MB, {size['minutes']} min" + (f", {gres[rule]}" if rule in gres else "")
        said = refusal([*(["-p", part] if part else []), "--cpus-per-task", str(size["cpus"]), "--mem", f"{size['mem_mb']}M",
                        "--time", str(size["minutes"]), *([gres[rule]] if rule in gres else [])])
        where = part or "the default partition"
        out.append(Finding("job size", not said, f"sbatch refuses rule {rule}'s jobs ({what}) in {where}: {said}" if said
                           else f"rule {rule}: {what} accepted in {where}",
                           f"profiles/slurm/profile.yaml: {resources_key(rule)}.cpus_per_task / mem_mb / runtime (the nodes' size)"))
    return out


# -- engines: weights and KV cache ----------------------------------------------------------------

def kv_bytes_per_token(model_config: dict, dtype_bytes: int = 2, tensor_parallel: int = 1) -> int:
    """Bytes of KV cache one token needs on one GPU: keys and values of every layer's KV heads
    (split across ``tensor_parallel`` GPUs, at least one head each)."""
    c = model_config.get("text_config", model_config)
    heads = c["num_attention_heads"]
    kv_heads = c.get("num_key_value_heads") or heads
    head_dim = c.get("head_dim") or c["hidden_size"] // heads
    return 2 * c["num_hidden_layers"] * max(1, kv_heads // tensor_parallel) * head_dim * dtype_bytes


def engine_finding(where: str, *, model_config: dict, params_b: float, context: int | None, utilization: float,
                   gpu_gib: float, tensor_parallel: int, setting: str) -> Finding:
    """Whether an engine's weights and one ``context``-token sequence's KV cache fit its share."""
    c = model_config.get("text_config", model_config)
    context = int(context or c.get("max_position_embeddings") or 0)
    kv = context * kv_bytes_per_token(model_config, tensor_parallel=tensor_parallel) / GIB
    weights = params_b * 1e9 * 2 / GIB / tensor_parallel
    left = utilization * gpu_gib - weights - ENGINE_OVERHEAD_GIB
    text = (f"{where}: a {context:,}-token sequence needs {kv:.1f} GiB of KV cache a GPU; its share {utilization} x "
            f"{gpu_gib} GiB leaves {left:.1f} GiB after {weights:.1f} GiB of bf16 weights and {ENGINE_OVERHEAD_GIB} GiB "
            f"of activations")
    return Finding("engine memory", kv <= left, text, "" if kv <= left else setting)


def engine_findings(cfg: dict, model_configs: dict[str, dict]) -> list[Finding]:
    """Every vLLM engine the config starts on GPUs, per model whose ``config.json`` is known."""
    from pwopsd.config import diagnostic_models, eval_models
    from pwopsd.config.design import rollout_context
    from pwopsd.cost import model_size_b

    out, gpu_gib, tr = [], cfg["cluster"]["gpu_memory_gib"], cfg["training"]
    for name, mc in model_configs.items():
        entry, size = cfg["models"][name], model_size_b(cfg, name)
        v = entry.get("vllm") or {}
        tp = int(v.get("tensor_parallel_size", 1))
        if entry["gpus"]["train"] and tr["rollout_backend"] == "vllm":
            out.append(engine_finding(f"models.{name}: the rollout engine of each training rank", model_config=mc,
                                      params_b=size, context=rollout_context(cfg),
                                      utilization=v.get("train_gpu_memory_utilization", 0.4), gpu_gib=gpu_gib,
                                      tensor_parallel=1, setting=f"models.{name}.vllm.train_gpu_memory_utilization or "
                                      "training.rollout_max_model_len"))
        if entry["gpus"]["generate"] and cfg["evaluation"].get("backend", "vllm") == "vllm" and name in eval_models(cfg):
            out.append(engine_finding(f"models.{name}: the evaluation engine", model_config=mc, params_b=size,
                                      context=cfg["evaluation"].get("max_model_len"),
                                      utilization=v.get("gpu_memory_utilization", 0.9), gpu_gib=gpu_gib, tensor_parallel=tp,
                                      setting=f"models.{name}.vllm.gpu_memory_utilization or evaluation.max_model_len"))
        if entry["gpus"]["generate"] and name in diagnostic_models(cfg):
            d = cfg["diagnostic"]
            context = max(d["spine"].get("max_model_len") or 0, d["forced_continuation"].get("max_model_len") or 0)
            out.append(engine_finding(f"models.{name}: the diagnostic's engines", model_config=mc, params_b=size,
                                      context=context or None, utilization=v.get("gpu_memory_utilization", 0.9),
                                      gpu_gib=gpu_gib, tensor_parallel=tp, setting="diagnostic.spine.max_model_len"))
    return out


def hub_model_configs(cfg: dict) -> tuple[dict[str, dict], list[Finding]]:
    """Each Hub model's ``config.json`` at its pinned revision (the Hub cache, downloading it when
    allowed: a login node has the internet), and a finding per model whose file cannot be had."""
    from huggingface_hub import hf_hub_download

    from pwopsd.config import hub_models

    hub, out, missing = cfg.get("hub") or {}, {}, []
    for name in hub_models(cfg):
        entry = cfg["models"][name]
        try:
            path = hf_hub_download(entry["hf_id"], "config.json", revision=entry.get("revision"),
                                   cache_dir=hub.get("cache_dir"), local_files_only=bool(hub.get("offline")))
            out[name] = json.loads(Path(path).read_text())
        except Exception as exc:  # noqa: BLE001 - offline, not cached, gated: said, not raised
            missing.append(Finding("engine memory", False, f"models.{name}: config.json of {entry['hf_id']} cannot be read "
                                   f"({type(exc).__name__}): its engines are not checked", "hub.offline / hub.cache_dir"))
    return out, missing


# -- the rollout sync folder ----------------------------------------------------------------------

def sync_folder_findings(folder: Path, cfg: dict, probe_mib: int = 256) -> list[Finding]:
    """Free space for every rank's merged bf16 weights (twice: the atomic write keeps the old file
    until the new one is complete) and the write speed, against the cost plan's sync seconds."""
    from pwopsd.config import trained_models
    from pwopsd.cost import assumptions, model_size_b

    folder.mkdir(parents=True, exist_ok=True)
    out, a = [], assumptions(cfg)
    probe = folder / f".pwopsd-preflight-{os.getpid()}"
    block = os.urandom(1 << 20)
    t0 = time.perf_counter()
    with open(probe, "wb") as fh:
        for _ in range(probe_mib):
            fh.write(block)
        fh.flush()
        os.fsync(fh.fileno())
    speed = probe_mib / 1024 / (time.perf_counter() - t0)  # GiB/s
    probe.unlink()
    free = shutil.disk_usage(folder).free / GIB
    for name in trained_models(cfg) if cfg["training"]["rollout_policy"] == "merged_bf16" else []:
        ranks = max(1, cfg["models"][name]["gpus"]["train"])
        per_step = ranks * model_size_b(cfg, name) * 1e9 * 2 / GIB
        planned = a["merged_sync_s_per_b_params"] * model_size_b(cfg, name)
        seconds = per_step / speed
        out.append(Finding("sync folder", free >= 2 * per_step,
                           f"{folder}: {free:.0f} GiB free, the {ranks} ranks of {name} write {per_step:.0f} GiB a step "
                           f"(twice that while replacing)", "training.rollout_sync_dir"))
        out.append(Finding("sync speed", seconds <= 2 * planned, warn=True, message=
                           f"{folder}: writes {speed:.2f} GiB/s: {seconds:.0f} s a step for {name}'s merged weights, the "
                           f"cost plan assumes {planned:.0f} s", setting="training.rollout_sync_dir (a faster disk), or "
                           "cluster.cost_assumptions.merged_sync_s_per_b_params (the plan)"))
    return out or [Finding("sync folder", True, f"{folder}: {free:.0f} GiB free, {speed:.2f} GiB/s (no merged_bf16 sync)")]


# -- the GPU node ---------------------------------------------------------------------------------

def node_findings(driver: str | None, env_files=JOB_ENVS, repo: Path = REPO) -> list[Finding]:
    """The node's NVIDIA driver against the CUDA runtime each job environment pins."""
    from pwopsd.accelerator import driver_problem, env_cuda

    out = []
    for rel in env_files:
        cuda = env_cuda(repo / rel)
        if cuda is None:
            continue
        problem = driver_problem(driver, cuda, rel)
        out.append(Finding("driver", not problem, problem or f"{rel}: CUDA {cuda[0]}.{cuda[1]} runs on driver {driver}",
                           "the GPU partition (newer drivers), or a lock for an older CUDA (python tools/stacks.py lock)"))
    return out


def gpu_job_findings(profile: dict, cfg: dict, env: dict | None = None, timeout_s: int = 900,
                     sync_dir: str | None = None) -> list[Finding]:
    """Run ``python -m pwopsd.preflight node`` as a one-GPU job of the train rule's partition and
    GPU type (``sbatch --wait``) and read what it found; with ``sync_dir`` (a node-local folder such
    as ``$TMPDIR``, expanded there) the job measures the rollout sync folder too."""
    reqs = {r: (p, m) for r, p, m, _ in gpu_requests(profile, cfg)}
    if "train" not in reqs:
        return [Finding("GPU job", False, "no GPU rule with a gpu_model in the profile", "profiles/slurm/profile.yaml")]
    part, model = reqs["train"]
    account = profile_account(profile)
    out_file = Path.cwd() / f".pwopsd-preflight-node-{os.getpid()}.json"
    extras = [Path(str(out_file) + e) for e in (".log", ".config")]
    node = [sys.executable, "-m", "pwopsd.preflight", "node", "--json", str(out_file)]
    if sync_dir:
        extras[1].write_text(json.dumps(cfg))
        node += ["--sync-dir", sync_dir, "--config-json", str(extras[1])]
    cmd = ["sbatch", "--wait", "-p", part, f"--gpus={model}:1", "--time", "10", "-o", str(extras[0]),
           *(["--account", account] if account else []), "--wrap", shlex.join(node)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout_s)
        if not out_file.exists():
            said = (proc.stderr + (extras[0].read_text() if extras[0].exists() else ""))[-600:]
            return [Finding("GPU job", False, f"the GPU job wrote nothing (sbatch exit {proc.returncode}): {said}",
                            "profiles/slurm/profile.yaml: set-resources.train")]
        return [Finding(**f) for f in json.loads(out_file.read_text())]
    finally:
        for f in (out_file, *extras):
            f.unlink(missing_ok=True)


def node_main(json_out: str | None, sync_dir: str | None = None, cfg: dict | None = None) -> list[Finding]:
    from pwopsd.accelerator import driver_version
    from pwopsd.io import node_folder

    found = node_findings(driver_version())
    if sync_dir:
        found += [Finding(f.check, f.ok, f"on GPU node {os.uname().nodename}: {f.message}", f.setting, f.warn)
                  for f in sync_folder_findings(node_folder(sync_dir), cfg)]
    if json_out:
        Path(json_out).write_text(json.dumps([asdict(f) for f in found]))
    return found


# -- the command ----------------------------------------------------------------------------------

def failed(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if not f.ok and not f.warn]


def report(findings: list[Finding]) -> str:
    lines = []
    for f in findings:
        lines.append(f"{'ok  ' if f.ok else 'WARN' if f.warn else 'FAIL'} {f.check:14s} {f.message}")
        if not f.ok and f.setting:
            lines.append(f"     {'':14s} -> change: {f.setting}")
    bad = len(failed(findings))
    lines.append(f"{len(findings)} checks, {bad} failed" + ("" if bad else ": ready for the canary (docs/cluster.md)"))
    return "\n".join(lines)


def cluster_findings(profile: dict, cfg: dict, *, sync_dir: str | None = None, gpu_job: bool = False,
                     env: dict | None = None) -> list[Finding]:
    """Every check of a login node (and, ``gpu_job``, of one GPU node) for ``profile`` and ``cfg``."""
    found = profile_findings(profile) + slurm_findings(profile, cfg, env=env)
    configs, missing = hub_model_configs(cfg)
    found += missing + engine_findings(cfg, configs)
    from pwopsd.io import node_folder

    folder = sync_dir or cfg["training"].get("rollout_sync_dir") or "results/training"
    # A folder named by a variable ($TMPDIR: the GPU node's own disk, set by Slurm for each job) is
    # another folder on the login node: it is measured where the jobs write it, by the GPU job.
    node_local = "$" in folder
    if not node_local:
        found += sync_folder_findings(node_folder(folder), cfg)
    elif not gpu_job:
        found.append(Finding("sync folder", False, f"{folder} is node-local: not measured here (the login node's is another "
                             "disk); python -m pwopsd.preflight --gpu-job measures it on a GPU node",
                             "--gpu-job (or training.rollout_sync_dir: a shared folder)", warn=True))
    if gpu_job:
        found += gpu_job_findings(profile, cfg, env=env, sync_dir=folder if node_local else None)
    return found


def main(argv=None) -> int:
    import yaml

    from pwopsd.config import load_config_files

    ap = argparse.ArgumentParser(prog="python -m pwopsd.preflight", description=__doc__.split("\n\n")[0])
    ap.add_argument("what", nargs="?", default="cluster", choices=["cluster", "node"])
    ap.add_argument("--profile", default=str(REPO / "profiles/slurm/profile.yaml"))
    ap.add_argument("--configfile", action="append", default=[], help="the config and overlays, as snakemake takes them")
    ap.add_argument("--gpu-job", action="store_true", help="also run one short job on a GPU node (its driver)")
    ap.add_argument("--sync-dir", help="the folder the rollout engines' weights are written to (default: "
                    "training.rollout_sync_dir, else results/training)")
    ap.add_argument("--json", help="write the findings as JSON here")
    ap.add_argument("--config-json", help=argparse.SUPPRESS)  # node: the login node's config (--gpu-job)
    args = ap.parse_args(argv)
    if args.what == "node":
        cfg = json.loads(Path(args.config_json).read_text()) if args.config_json else None
        found = node_main(args.json, args.sync_dir if cfg else None, cfg)
        print(report(found))
        return int(bool(failed(found)))
    cfg = load_config_files([REPO / "config/config.yaml", *args.configfile] if not args.configfile else args.configfile)
    profile_path = Path(args.profile)
    if profile_path.is_dir():
        profile_path = profile_path / "profile.yaml"
    profile = yaml.safe_load(profile_path.read_text()) or {}
    found = cluster_findings(profile, cfg, sync_dir=args.sync_dir, gpu_job=args.gpu_job)
    print(report(found))
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(f) for f in found], indent=1))
    return int(bool(failed(found)))


if __name__ == "__main__":
    sys.exit(main())

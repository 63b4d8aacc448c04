"""On-policy self-distillation training: one readable loop (nanoGPT style) on torch.distributed + peft.

Each optimizer step:

1. takes the next ``effective_batch`` training problems in a seeded order (resumable by step);
2. samples one student rollout per problem from the *current* weights (student prompt, n=1,
   T=1.1, top_p 0.95, top_k 20, at most ``max_completion_length`` tokens; per-request seeds derived
   from (seed, step, problem) so a resumed run repeats them exactly);
3. per micro-batch: assembles the student sequence ``[prompt | PAD.. | completion | PAD..]`` and the
   privileged teacher sequence ``[teacher prompt | PAD.. | completion | PAD..]`` as the reference
   does (right-padded prompts, attention mask ``id != pad``, default position ids: the
   "prompt-PAD gap"), runs the student with the adapter and the teacher with the adapter disabled
   (no grad), and computes the method's loss from the hidden states in chunks
   (:mod:`pwopsd.training.chunked`);
4. clips the gradient norm and steps AdamW with a linear decay to 0 over ``max_steps``.

Training stops after ``stop_at`` steps (``max_steps`` unless the config stops earlier: the steps it
does are those of the full run). Every ``save_every`` steps, and at the last step, the adapter,
optimizer, scheduler, step and RNG states (every rank's: :func:`rank_rng_state`) are written
atomically to ``<work_dir>/step-XXXXXX``; a restarted run resumes from the latest one, each rank
from its own RNG state. ``training.deterministic`` (:func:`set_determinism`) makes GPU kernels
deterministic as well; docs/cluster.md ("Determinism and bit-identical resumes") says which resumes
are bit-identical where.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from pwopsd.training import chunked as C
from pwopsd import prompts
from pwopsd.generation import GenerationRequest
from pwopsd.generation.rollout import HFRollouts
from pwopsd.io import atomic_path
from pwopsd.notice import Interrupted, Notice, agreed
from pwopsd.training.inputs import (  # noqa: F401  (Example, TrainConfig: the loop's names, as before the split)
    Example,
    PromptIds,
    TrainConfig,
    assemble,
    data_order,
    rollout_seed,
    teacher_message_for,
)
from pwopsd.training.process import dist_info, rank_rng_state, set_determinism, set_rank_rng_state  # noqa: F401

log = logging.getLogger(__name__)

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def completion_hidden(model, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Last hidden states at the positions that predict the completion tokens ``[B, Tc, H]``."""
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], position_ids=batch["position_ids"])
    P, Tc = int(batch["prompt_width"]), batch["completion"].shape[1]
    return out.last_hidden_state[:, P - 1 : P - 1 + Tc]


def method_loss(cfg: TrainConfig, h_s, h_t, weight, tokens, mask, step: int) -> torch.Tensor:
    """The run's loss (``cfg.method``, an entry of :data:`pwopsd.training.chunked.LOSSES`) on one micro-batch."""
    if cfg.method not in C.LOSSES:
        raise ValueError(f"unknown method {cfg.method!r} ({', '.join(C.LOSSES)})")
    return C.LOSSES[cfg.method](h_s, h_t, weight, tokens, mask, step=step, temperature=cfg.temperature, clip=cfg.clip,
                                upcast=cfg.opsd_upcast, chunk_size=cfg.chunk_size, **cfg.loss)


@torch.no_grad()
def token_stats(h_s, h_t, weight, mask, temperature: float, chunk_size: int) -> dict[str, float]:
    """Mean unclipped forward KL(teacher || student) and mean entropies over valid tokens."""
    flat = C.flatten_valid(h_s, h_t, torch.zeros_like(mask, dtype=torch.long), mask)
    n = flat.tokens.numel()
    if n == 0:
        return {"kl": 0.0, "student_entropy": 0.0, "teacher_entropy": 0.0}
    kl = hs_ent = ht_ent = 0.0
    for _, lps, lpt in C.chunk_log_probs(flat, weight, temperature, chunk_size):
        kl += float((lpt.exp() * (lpt - lps)).sum())
        hs_ent += float(-(lps.exp() * lps).sum())
        ht_ent += float(-(lpt.exp() * lpt).sum())
    return {"kl": kl / n, "student_entropy": hs_ent / n, "teacher_entropy": ht_ent / n}


def canonical_adapter_config(path: Path) -> None:
    """Rewrite PEFT's ``adapter_config.json`` with its module lists sorted. PEFT writes
    ``target_modules`` from a set, in the order of the process's string hashes, so the same run
    saved by two processes (a resumed job) would differ in that file; sorted, a run's adapter is
    the same bytes whichever process saved it."""
    cfg = json.loads(path.read_text())
    for key in ("target_modules", "modules_to_save"):
        if isinstance(cfg.get(key), list):
            cfg[key] = sorted(cfg[key])
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True))


class RolloutEngineError(RuntimeError):
    """The rollout engine failed during training; the message names the step, the engine's own
    first line and the checkpoint a rerun resumes from (the cause's traceback is in the log)."""


class RolloutContextError(ValueError):
    """A rollout would not fit the rollout engine's context: the engine would end it early (finish
    reason "length") and the run would train on shorter rollouts than configured, exit 0."""


def check_rollout_room(prompt_lengths: list[int], max_completion_length: int, max_model_len: int | None, where: str) -> None:
    """Raise :class:`RolloutContextError` when the longest prompt plus ``max_completion_length``
    exceeds the engine's ``max_model_len`` (``None``: no limit, the ``hf`` backend). Checked once,
    on the prompts of every step a run will train (the data order is fixed), before the first, so
    ``training.rollout_max_model_len`` can stay out of the run key: a run that passed it samples
    every rollout in full."""
    if not max_model_len or not prompt_lengths:
        return
    longest = max(prompt_lengths)
    if longest + max_completion_length > max_model_len:
        raise RolloutContextError(
            f"{where}: a student prompt of {longest} tokens plus training.max_completion_length={max_completion_length} "
            f"exceeds the rollout engine's context, training.rollout_max_model_len={max_model_len}: its rollouts would "
            f"be cut short; raise training.rollout_max_model_len to at least {longest + max_completion_length}")


# Values of a step that each rank computes over its own micro-batches and rollouts (every rank has
# as many): the step's value is their mean over the ranks.
RANK_STATS = ("loss", "kl", "student_entropy", "teacher_entropy", "rollout_length", "rollout_accuracy")


def mean_over_ranks(values: dict[str, float], device) -> dict[str, float]:
    """Each value's mean over the processes of the run (one all-reduce)."""
    import torch.distributed as dist

    keys = sorted(values)
    t = torch.tensor([values[k] for k in keys], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    t /= dist.get_world_size()
    return dict(zip(keys, t.tolist()))


def latest_checkpoint(work_dir: Path) -> Path | None:
    done = sorted(p for p in work_dir.glob("step-*") if (p / "trainer_state.pt").exists())
    return done[-1] if done else None


class Trainer:
    def __init__(self, model, tokenizer, examples: list[Example], cfg: TrainConfig, work_dir: str | Path, *,
                 add_special_tokens: bool = True, think_closure: bool = True, answer_check=None, rollouts=None,
                 tracker=None):
        from peft import LoraConfig, get_peft_model

        self.cfg = cfg
        self.tok = tokenizer
        self.examples = examples
        self.work_dir = Path(work_dir)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.answer_check = answer_check
        set_determinism(cfg.deterministic)
        torch.manual_seed(cfg.seed)
        if cfg.gradient_checkpointing:
            # Non-reentrant checkpointing: works with frozen base weights (no input grads needed) and
            # is active only in training mode, so rollouts (eval mode, KV cache) are unaffected.
            if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5 (the old name is deprecated)
                model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
            else:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        lora = LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                          target_modules=list(cfg.lora_targets), task_type="CAUSAL_LM", bias="none")
        self.model = get_peft_model(model, lora)
        self.inner = self.model.base_model.model  # the *ForCausalLM with LoRA layers injected
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lambda s: max(0.0, 1.0 - s / cfg.max_steps))
        self.step = 0
        self.rank, self.world = dist_info()
        world_batch = cfg.rank_batch * self.world
        self.order = data_order(len(examples), cfg.seed, epochs=1 + cfg.max_steps * world_batch // max(1, len(examples)))
        self.student_ids = PromptIds(lambda e: prompts.prompt_ids(
            tokenizer, prompts.student_message(e.problem), prompts.STUDENT, think_closure=think_closure,
            add_special_tokens=add_special_tokens), examples)
        self.teacher_ids = (self.student_ids if cfg.teacher_prompt == "student" else PromptIds(lambda e: prompts.prompt_ids(
            tokenizer, teacher_message_for(e, cfg.teacher_prompt, transition=cfg.teacher_transition), prompts.TEACHER,
            add_special_tokens=add_special_tokens), examples))
        self.device = next(self.model.parameters()).device
        # The rollout engine (pwopsd.generation.rollout): by default the live model; the train job
        # passes a colocated vLLM one (training.rollout_backend: vllm, made by make_rollouts).
        self.rollout_engine = rollouts if rollouts is not None else HFRollouts(
            self.inner, tokenizer, batch_size=cfg.rollout_batch_size, policy=cfg.rollout_policy)
        # Experiment tracking (pwopsd.tracking.Tracker, rank 0 only): each logged step is sent too.
        self.tracker = tracker

    # -- checkpoints -------------------------------------------------------------------------
    def _gather_rng(self) -> list[dict] | None:
        """Every rank's :func:`rank_rng_state`, on rank 0 (index = rank); None on the others. Every
        rank must call it (a collective). The states are Python objects (pickled into byte tensors):
        under gloo on CPU, under NCCL on each rank's own GPU, the current CUDA device, which is made
        the model's for the call (torch.distributed's note on object collectives)."""
        state = rank_rng_state(self.device)
        if self.world <= 1:
            return [state]
        import torch.distributed as dist

        gathered = [None] * self.world if self.rank == 0 else None
        on_gpu = dist.get_backend() == "nccl" and self.device.type == "cuda"
        with torch.cuda.device(self.device) if on_gpu else contextlib.nullcontext():
            dist.gather_object(state, gathered, dst=0)
        return gathered

    def save(self) -> Path | None:
        """Rank 0 writes the checkpoint (every rank calls this: the RNG states are gathered)."""
        from peft import get_peft_model_state_dict

        rng = self._gather_rng()
        if self.rank != 0:
            return None
        final = self.work_dir / f"step-{self.step:06d}"
        with atomic_path(final) as tmp:
            tmp.mkdir()
            self.model.save_pretrained(tmp)
            canonical_adapter_config(tmp / "adapter_config.json")
            torch.save({"step": self.step, "optimizer": self.opt.state_dict(), "scheduler": self.sched.state_dict(),
                        "rng_ranks": rng, "adapter": get_peft_model_state_dict(self.model),
                        "config": asdict(self.cfg)}, tmp / "trainer_state.pt")
        return final

    def _restore_rng(self, state: dict, ckpt: Path) -> None:
        ranks = state.get("rng_ranks")
        if ranks is None:
            # A checkpoint of the old layout (one ``rng`` dict: rank 0's CPU states, no CUDA state):
            # restored on every rank, as the code that wrote it did. Bit-identical to an uninterrupted
            # run with one process, or with LoRA dropout 0 (nothing else draws from these generators);
            # with dropout and several processes, ranks > 0 draw other masks. (The train job's run key
            # holds the training code's hash, so only a Trainer used directly meets such a checkpoint.)
            set_rank_rng_state(state["rng"], self.device)
            return
        if len(ranks) != self.world:
            raise RuntimeError(
                f"{ckpt} was written by a run of {len(ranks)} process(es) but this run has {self.world}: each rank "
                "resumes from its own RNG state and its own share of every step's problems, so a resume in another "
                "world would train another run. Resume with the same number of processes (gpus.train of the model), "
                f"or delete {ckpt.parent} to train from step 0")
        set_rank_rng_state(ranks[self.rank], self.device)

    def resume(self) -> bool:
        from peft import set_peft_model_state_dict

        # A kill inside a checkpoint write (or the log's rewrite below) leaves its temporary folder
        # (atomic_path), never a step-* folder or a partial log: it is never read, and is removed here.
        if self.rank == 0:
            for partial in [*self.work_dir.glob(".step-*.tmp"), *self.work_dir.glob(".train_log.jsonl.*.tmp")]:
                shutil.rmtree(partial, ignore_errors=True)
        ckpt = latest_checkpoint(self.work_dir)
        if ckpt is not None:
            # onto the CPU: saved by rank 0 from cuda:0, the tensors would otherwise be loaded to GPU 0
            # and hold memory there for every other rank's whole job; the adapter and the optimizer
            # state are copied to the parameters' device below, the RNG states are CPU tensors
            state = torch.load(ckpt / "trainer_state.pt", weights_only=False, map_location="cpu")
            set_peft_model_state_dict(self.model, state["adapter"])
            self.opt.load_state_dict(state["optimizer"])
            self.sched.load_state_dict(state["scheduler"])
            self._restore_rng(state, ckpt)
            self.step = int(state["step"])
            log.info("resumed from %s (step %d)", ckpt, self.step)
        if self.rank == 0:
            self._clean_log(self.work_dir / "train_log.jsonl")
        return ckpt is not None

    def _clean_log(self, log_path: Path) -> None:
        """The step log as the resumed run continues it: one line per step up to the checkpoint's, in
        step order. Rewritten atomically (a kill here loses nothing), only when that changes it.

        Steps logged after the checkpoint (every step, without one) are redone: their lines are
        dropped, and a line that a kill cut short (it has no newline yet). Two copies of one training
        that wrote the same folder (a restarted Snakemake head beside the old Slurm job still running)
        leave interleaved duplicate lines of a step, and a line two appends garbled (not JSON; a
        network file system does not keep appends whole): the last line written of a step is kept.
        Each copy writes a step's line just before it saves that step, so the copy that wrote the
        last line of a step most likely also renamed its checkpoint into place last, and the
        surviving checkpoint, which this run continues, is that copy's."""
        if not log_path.exists():
            return
        text = log_path.read_text()
        lines = text.splitlines()[: text.count("\n")]
        last: dict[int, str] = {}
        garbled = duplicates = 0
        for ln in lines:
            if not ln:
                continue
            try:
                step = int(json.loads(ln)["step"])
            except (ValueError, TypeError, KeyError):
                garbled += 1
                continue
            duplicates += step in last
            last[step] = ln
        kept = [last[s] for s in sorted(last) if s <= self.step]
        if duplicates or garbled:
            log.warning("%s: %d duplicate step line(s) and %d unreadable line(s) dropped, the last line of each step "
                        "kept: two copies of this training wrote its folder at once", log_path, duplicates, garbled)
            gaps = sorted(set(range(1, self.step + 1)) - set(last))
            if gaps:
                log.warning("%s: no line of step(s) %s is left", log_path, ", ".join(map(str, gaps)))
        if kept != lines or not text.endswith("\n") and text:
            with atomic_path(log_path) as tmp:
                tmp.write_text("".join(ln + "\n" for ln in kept))

    # -- one optimizer step ------------------------------------------------------------------
    def batch_indices(self, step: int) -> list[int]:
        """This process's share of the step's problems (the world batch is split by rank)."""
        b = self.cfg.rank_batch
        start = (step * self.world + self.rank) * b
        return [int(i) for i in self.order[start : start + b]]

    def rollouts(self, idx: list[int], step: int) -> list[list[int]]:
        """The step's rollouts from the current policy: the rollout engine is synced to it first.
        An engine that fails (it cannot start, or it died) fails the run with a line that names the
        step and the checkpoint a rerun resumes from."""
        reqs = [GenerationRequest(tuple(self.student_ids[i]), n=1, seed=rollout_seed(self.cfg.seed, step, i),
                                  temperature=self.cfg.temperature, top_p=self.cfg.rollout_top_p, top_k=self.cfg.rollout_top_k,
                                  max_new_tokens=self.cfg.max_completion_length) for i in idx]
        try:
            self.sync_seconds = self.rollout_engine.sync(self.model, step)
            return [o[0].token_ids for o in self.rollout_engine.generate(reqs)]
        except Exception as exc:
            ckpt = latest_checkpoint(self.work_dir)
            first = (str(exc).strip().splitlines() or [""])[0]
            raise RolloutEngineError(
                f"rank {self.rank}: the {self.rollout_engine.name} rollout engine failed at step {step} "
                f"({type(exc).__name__}: {first}); a rerun resumes from "
                f"{ckpt.name if ckpt else 'step 0 (no checkpoint yet)'}") from exc

    def train_step(self) -> dict[str, float]:
        cfg, step = self.cfg, self.step
        t0 = time.perf_counter()
        idx = self.batch_indices(step)
        completions = self.rollouts(idx, step)
        t_roll = time.perf_counter() - t0
        self.model.train()  # LoRA dropout and activation checkpointing act in training mode only
        weight = self.inner.get_output_embeddings().weight
        stats = {"loss": 0.0, "kl": 0.0, "student_entropy": 0.0, "teacher_entropy": 0.0}
        mb = cfg.per_device_batch_size
        for k in range(cfg.gradient_accumulation_steps):
            sel = list(range(k * mb, (k + 1) * mb))
            s_batch = assemble([self.student_ids[idx[j]] for j in sel], [completions[j] for j in sel], self.pad_id,
                               position_mode=cfg.position_ids)
            t_batch = assemble([self.teacher_ids[idx[j]] for j in sel], [completions[j] for j in sel], self.pad_id,
                               position_mode=cfg.position_ids)
            s_batch = {k2: v.to(self.device) for k2, v in s_batch.items()}
            t_batch = {k2: v.to(self.device) for k2, v in t_batch.items()}
            h_s = completion_hidden(self.inner.model, s_batch)
            with torch.no_grad(), self.model.disable_adapter():
                h_t = completion_hidden(self.inner.model, t_batch)
            loss = method_loss(cfg, h_s, h_t, weight, s_batch["completion"], s_batch["mask"], step)
            (loss / cfg.gradient_accumulation_steps).backward()
            stats["loss"] += float(loss.detach()) / cfg.gradient_accumulation_steps
            for key, v in token_stats(h_s.detach(), h_t, weight.detach(), s_batch["mask"], cfg.temperature, cfg.chunk_size).items():
                stats[key] += v / cfg.gradient_accumulation_steps
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        if self.world > 1:  # average the (small) LoRA gradients over the processes
            import torch.distributed as dist

            for p in trainable:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                dist.all_reduce(p.grad)
                p.grad /= self.world
        grad_norm = torch.nn.utils.clip_grad_norm_(trainable, cfg.grad_clip)
        self.opt.step()
        self.sched.step()
        self.opt.zero_grad(set_to_none=True)
        self.step += 1
        lengths = [len(c) for c in completions]
        stats.update({"step": self.step, "lr": self.sched.get_last_lr()[0], "grad_norm": float(grad_norm),
                      "rollout_length": float(np.mean(lengths)), "seconds": time.perf_counter() - t0,
                      "rollout_seconds": t_roll, "sync_seconds": self.sync_seconds})
        # the sync's parts (a vLLM engine's: merge, write, engine reload and probe, check; bytes written)
        stats.update({f"sync_{k}": v for k, v in getattr(self.rollout_engine, "phases", {}).items()})
        if self.answer_check is not None:
            texts = [self.tok.decode(c, skip_special_tokens=True) for c in completions]
            stats["rollout_accuracy"] = float(np.mean(self.answer_check(texts, [self.examples[i].answer for i in idx])))
        if self.world > 1:  # the step's values, not rank 0's share of its micro-batches (rank 0 writes the log)
            stats.update(mean_over_ranks({k: stats[k] for k in RANK_STATS if k in stats}, self.device))
        return stats

    def train(self, *, stop_after: int | None = None) -> list[dict]:
        """Train to :attr:`TrainConfig.last_step` (resuming if possible); ``stop_after`` simulates a kill after that many steps.

        A notice signal (SIGTERM, SIGUSR1, SIGINT: :mod:`pwopsd.notice`) lets the step in
        progress finish; then every rank stops after that step, a checkpoint is written and
        :class:`~pwopsd.notice.Interrupted` is raised."""
        self.resume()
        if self.cfg.rollout_backend != "hf":  # every planned step's prompts (every rank's), before hours of training
            b = self.cfg.rank_batch * self.world
            planned = sorted({int(i) for i in self.order[self.step * b : self.cfg.last_step * b]})
            check_rollout_room([len(self.student_ids[i]) for i in planned], self.cfg.max_completion_length,
                               (self.cfg.rollout_engine or {}).get("max_model_len"),
                               f"steps {self.step + 1} to {self.cfg.last_step}")
        history_path = self.work_dir / "train_log.jsonl"
        done = 0
        history = []
        with Notice() as notice:
            while self.step < self.cfg.last_step:
                stats = self.train_step()
                history.append(stats)
                if self.rank == 0:
                    with open(history_path, "a") as fh:
                        fh.write(json.dumps(stats) + "\n")
                    if self.tracker is not None:
                        self.tracker.log({k: v for k, v in stats.items() if k != "step"}, self.step)
                log.info("step %d/%d loss %.5f kl %.4f len %.1f %.2fs", self.step, self.cfg.max_steps, stats["loss"],
                         stats["kl"], stats["rollout_length"], stats["seconds"])
                stop = agreed(notice.received is not None, self.world)
                if stop or self.step % self.cfg.save_every == 0 or self.step == self.cfg.last_step:
                    self.save()
                if stop and self.step < self.cfg.last_step:
                    raise Interrupted(f"stopped on {notice.received or 'a notice to another rank'} after step {self.step} "
                                      f"of {self.cfg.last_step}; checkpoint step-{self.step:06d} written, a rerun resumes "
                                      "from it", self.step)
                done += 1
                if stop_after is not None and done >= stop_after:
                    break
        return history

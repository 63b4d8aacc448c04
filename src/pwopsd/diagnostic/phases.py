"""The branch-viability diagnostic, Phases A-G (paper §3.2, Appendices A-B), as functions over tables.

One rule per phase; the files between them (``results/diagnostic/{model}/``):

* A ``spines.parquet``: one row per sampled problem: the student-template greedy rollout (T=0.7
  fallback where greedy has no ``\\boxed`` within the token budget), its token ids, its answer and
  whether it is correct;
* B ``teacher_pass.parquet``: one row per spine position: the teacher-template distribution's full
  entropy, top-M valid-token truncated entropy and top-k token ids/probabilities;
* C ``candidates.parquet``: one row per candidate position with its forced children;
* D ``mc_dropout.parquet``: H_full, MI and the raw Dirichlet precision per candidate;
* E ``forced_continuations.parquet``: one row per student-context continuation of a forced child;
* F ``labels.parquet``: child viabilities and the candidate's label;
* G ``scored.parquet`` + ``branch_auroc.json``: residualized AUROC / AUPRC with cluster-bootstrap
  intervals per score.

Phase G and the fitted schedule live in :mod:`pwopsd.diagnostic.scores`, the statistics in
:mod:`pwopsd.diagnostic.statistics`, the per-spine primitives in :mod:`pwopsd.diagnostic.branch_points`.
"""

from __future__ import annotations

import logging
import zlib
from typing import Any, Sequence

import numpy as np
import pandas as pd

from pwopsd import prompts
from pwopsd.diagnostic import statistics as stats
from pwopsd.diagnostic.branch_points import (forced_continuation_requests, last_hidden_states, mc_dropout,
                                             select_candidates, teacher_pass, truncated_entropy)
from pwopsd.evaluation.grading import extract_boxed
from pwopsd.generation import GenerationRequest
from pwopsd.models import decoder_layers

log = logging.getLogger(__name__)

PROBLEM_KEY = ["dataset", "problem_id"]
CANDIDATE_KEY = [*PROBLEM_KEY, "candidate"]

class DiagnosticError(ValueError):
    pass


# ---------------------------------------------------------------------------------------------
# Problems and prompts


def sample_problems(benchmarks: dict[str, pd.DataFrame], counts: dict[str, int], seed: int) -> pd.DataFrame:
    """Phase A's problem draw: ``counts[name]`` problems of each benchmark, without replacement.

    Dataset ``i`` (in ``counts`` order) is drawn with ``numpy.random.default_rng([seed, i])``; rows
    keep the benchmark's order. Columns: dataset, problem_id, problem, answer, solution.
    """
    frames = []
    for i, (name, k) in enumerate(counts.items()):
        table = benchmarks[name]
        if k > len(table):
            raise DiagnosticError(f"diagnostic.datasets.{name}: asks for {k} problems, the benchmark has {len(table)}")
        rows = np.sort(np.random.default_rng([seed, i]).choice(len(table), size=k, replace=False))
        part = table.iloc[rows]
        frames.append(pd.DataFrame({
            "dataset": name,
            "problem_id": part["id"].astype(str).to_numpy(),
            "problem": part["problem"].astype(str).to_numpy(),
            "answer": part["answer"].astype(str).to_numpy(),
            "solution": (part["solution"].astype(str) if "solution" in part else pd.Series([""] * k)).to_numpy(),
        }))
    return pd.concat(frames, ignore_index=True)


def student_prompt_ids(tokenizer, problem: str, *, kind: str, chat_template: dict) -> list[int]:
    """The diagnostic's student template: ``eval`` (the deployment prompt, thinking on) or
    ``student`` (the OPSD training student prompt, thinking off + think-closure)."""
    specials = bool(chat_template.get("add_special_tokens", True))
    if kind == "eval":
        return prompts.prompt_ids(tokenizer, prompts.eval_message(problem), prompts.EVAL, add_special_tokens=specials)
    if kind == "student":
        return prompts.prompt_ids(tokenizer, prompts.student_message(problem), prompts.STUDENT, add_special_tokens=specials,
                                  think_closure=bool(chat_template.get("think_closure", True)))
    raise DiagnosticError(f"diagnostic.student_prompt: unknown template {kind!r} (eval or student)")


def teacher_prompt_ids(tokenizer, row, *, kind: str, chat_template: dict) -> list[int]:
    """The diagnostic's teacher template: ``privileged_answer`` (paper Appendix A) or ``training``
    (the OPSD training teacher, which quotes the reference solution); thinking on, no closure."""
    if kind == "privileged_answer":
        message = prompts.diagnostic_teacher_message(row["problem"], row["answer"])
    elif kind == "training":
        message = prompts.teacher_message(row["problem"], row["solution"])
    else:
        raise DiagnosticError(f"diagnostic.teacher_prompt: unknown template {kind!r} (privileged_answer or training)")
    return prompts.prompt_ids(tokenizer, message, prompts.TEACHER,
                              add_special_tokens=bool(chat_template.get("add_special_tokens", True)))


class TokenFilter:
    """Which token ids may be candidate children and count in the truncated entropy.

    Dropped: special and added control tokens (EOS, ``<|im_start|>``, ``<think>``, ...), and junk:
    tokens that decode to nothing, to an incomplete UTF-8 byte (U+FFFD), or to non-printable
    characters other than whitespace; with ``drop_whitespace`` also whitespace-only tokens.
    """

    def __init__(self, tokenizer, *, drop_whitespace: bool = False):
        self.tokenizer = tokenizer
        self.drop_whitespace = drop_whitespace
        self.special = set(int(i) for i in tokenizer.all_special_ids)
        self.special |= set(int(i) for i in getattr(tokenizer, "added_tokens_decoder", {}))
        self._cache: dict[int, bool] = {}

    def __call__(self, token_id: int) -> bool:
        token_id = int(token_id)
        hit = self._cache.get(token_id)
        if hit is None:
            hit = self._cache[token_id] = self._valid(token_id)
        return hit

    def _valid(self, token_id: int) -> bool:
        if token_id in self.special:
            return False
        text = self.tokenizer.decode([token_id])
        if not text or "\ufffd" in text:
            return False
        if text.isspace():
            return not self.drop_whitespace
        return all(c.isprintable() or c.isspace() for c in text)

    def mask(self, ids: np.ndarray) -> np.ndarray:
        """Vectorized validity of an array of ids (each distinct id decoded once)."""
        uniq, inverse = np.unique(ids, return_inverse=True)
        return np.array([self(i) for i in uniq], dtype=bool)[inverse].reshape(ids.shape)


def strip_stop(token_ids: Sequence[int], special: set[int]) -> list[int]:
    """The spine: generated ids without the trailing stop token(s)."""
    ids = [int(t) for t in token_ids]
    while ids and ids[-1] in special:
        ids.pop()
    return ids


def boxed_start(tokenizer, spine_ids: Sequence[int], marker: str = "\\boxed") -> int | None:
    """Index of the spine token where the first ``\\boxed`` begins (None without one).

    Binary search over decoded prefixes: the smallest ``t`` whose prefix ``spine[:t+1]`` decodes
    past the marker's first character.
    """
    text = tokenizer.decode(list(spine_ids))
    at = text.find(marker)
    if at < 0:
        return None
    lo, hi = 0, len(spine_ids) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if len(tokenizer.decode(list(spine_ids[: mid + 1]))) > at:
            hi = mid
        else:
            lo = mid + 1
    return lo


# ---------------------------------------------------------------------------------------------
# Phase A: spines


def run_spines(backend, tokenizer, problems: pd.DataFrame, settings: dict, *, grade, partial_root,
               shard_size: int = 50, notice=None) -> pd.DataFrame:
    """Greedy student-template rollouts, then a seeded T=``fallback_temperature`` rollout for the
    problems whose greedy spine has no ``\\boxed{...}``; the spine's answer is graded with
    ``grade(predictions, golds) -> list[bool]``. Resumable through ``partial_root`` (a function
    of a key and a part name, ``greedy`` or ``fallback``, returning the folder of that part's kept
    shards: :func:`pwopsd.io.partial_dir` with the job's model identity added to the key, as the
    spines script does); with a ``notice``,
    it stops at a shard boundary as :func:`pwopsd.generation.sampling.generate_resumable`."""
    from pwopsd.generation.sampling import PromptTooLongError, SamplingConfig, generate_resumable

    sp = settings["spine"]
    chat_template = settings["chat_template"]
    prompt_ids = [student_prompt_ids(tokenizer, p, kind=settings["student_prompt"], chat_template=chat_template)
                  for p in problems["problem"]]

    def request(ids, temperature, seed):
        # The fallback rollouts carry one seed (diagnostic.spine.seed): a stream per prompt keeps
        # the problems' draws apart.
        sampling = SamplingConfig(n=1, temperature=temperature, top_p=1.0 if temperature == 0 else float(sp["fallback_top_p"]),
                                  top_k=0, max_new_tokens=int(sp["max_new_tokens"]), max_model_len=int(sp["max_model_len"]),
                                  seed=seed, streams="per_prompt")
        try:
            return sampling.request(ids)
        except PromptTooLongError as exc:
            raise DiagnosticError(f"diagnostic.spine.max_model_len: a student {exc}") from None

    keys = problems[PROBLEM_KEY].to_dict("records")
    greedy_reqs = [request(ids, 0.0, None) for ids in prompt_ids]
    greedy = generate_resumable(backend, greedy_reqs, keys, partial=partial_root({"requests": greedy_reqs, "keys": keys}, "greedy"),
                                shard_size=shard_size, token_ids=True, notice=notice)
    greedy["decoding"] = "greedy"
    redo = [i for i, text in enumerate(greedy["text"]) if extract_boxed(text) is None]
    log.info("spines: %d/%d greedy rollouts reach \\boxed; %d fall back to T=%s", len(greedy) - len(redo), len(greedy),
             len(redo), sp["fallback_temperature"])
    if redo:
        fb_reqs = [request(prompt_ids[i], float(sp["fallback_temperature"]), int(sp["seed"])) for i in redo]
        fb_keys = [keys[i] for i in redo]
        fallback = generate_resumable(backend, fb_reqs, fb_keys, partial=partial_root({"requests": fb_reqs, "keys": fb_keys}, "fallback"),
                                      shard_size=shard_size, token_ids=True, notice=notice)
        fallback["decoding"] = "fallback"
        greedy = pd.concat([greedy.drop(index=redo), fallback]).set_index(PROBLEM_KEY).loc[
            pd.MultiIndex.from_frame(problems[PROBLEM_KEY])].reset_index()
    special = TokenFilter(tokenizer).special
    out = problems.copy()
    out["prompt_ids"] = [list(map(int, p)) for p in prompt_ids]
    out["spine_ids"] = [strip_stop(t, special) for t in greedy["token_ids"]]
    out["spine_length"] = [len(s) for s in out["spine_ids"]]
    out["text"] = greedy["text"].to_numpy()
    out["decoding"] = greedy["decoding"].to_numpy()
    out["finish_reason"] = greedy["finish_reason"].to_numpy()
    out["extracted"] = [extract_boxed(t) for t in out["text"]]
    out["correct"] = grade(list(out["extracted"]), list(out["answer"]))
    return out


# ---------------------------------------------------------------------------------------------
# Phase B: teacher pass


def run_teacher_pass(model, tokenizer, spines: pd.DataFrame, settings: dict) -> pd.DataFrame:
    """Per spine position: full entropy, truncated entropy over the top-M valid tokens, and the
    top-k ids/probabilities of the teacher-template distribution (streamed, see
    :func:`pwopsd.diagnostic.branch_points.teacher_pass`)."""
    tp = settings["teacher_pass"]
    keep = TokenFilter(tokenizer, drop_whitespace=bool(settings["candidates"]["drop_whitespace"]))
    frames = []
    for _, row in spines.iterrows():
        spine = list(row["spine_ids"])
        if not spine:
            continue
        prompt = teacher_prompt_ids(tokenizer, row, kind=settings["teacher_prompt"], chat_template=settings["chat_template"])
        out = teacher_pass(model, prompt, spine, top_k=int(tp["top_k"]), chunk_size=int(tp["chunk_size"]))
        valid = keep.mask(out["top_ids"])
        h_trunc = [truncated_entropy(p, v, int(tp["top_m"]), tp["h_trunc"]) for p, v in zip(out["top_probs"], valid)]
        frames.append(pd.DataFrame({
            "dataset": row["dataset"], "problem_id": row["problem_id"], "position": np.arange(len(spine)),
            "token_id": spine, "entropy": out["entropy"].astype(np.float32), "h_trunc": np.asarray(h_trunc, np.float32),
            "top_ids": list(out["top_ids"].astype(np.int32)), "top_probs": list(out["top_probs"].astype(np.float32)),
        }))
    if not frames:
        return pd.DataFrame(columns=["dataset", "problem_id", "position", "token_id", "entropy", "h_trunc", "top_ids", "top_probs"])
    return pd.concat(frames, ignore_index=True)


# ---------------------------------------------------------------------------------------------
# Phase C: candidates


def run_candidates(tokenizer, spines: pd.DataFrame, teacher: pd.DataFrame, settings: dict) -> pd.DataFrame:
    """Up to ``max_per_problem`` high-truncated-entropy plausible positions per spine, with their
    top ``children`` valid tokens as forced alternatives (:func:`pwopsd.diagnostic.branch_points.select_candidates`)."""
    c = settings["candidates"]
    keep = TokenFilter(tokenizer, drop_whitespace=bool(c["drop_whitespace"]))
    rows = []
    groups = {k: g for k, g in teacher.groupby(PROBLEM_KEY, sort=False)}
    for _, spine in spines.iterrows():
        g = groups.get((spine["dataset"], spine["problem_id"]))
        if g is None:
            continue
        g = g.sort_values("position")
        top_ids, top_probs = np.stack(g["top_ids"].to_numpy()), np.stack(g["top_probs"].to_numpy())
        start = boxed_start(tokenizer, spine["spine_ids"])
        chosen = select_candidates(top_ids, top_probs, keep, boxed_start=start, max_candidates=int(c["max_per_problem"]),
                                   spacing=int(c["spacing"]), p2_min=float(c["p2_min"]), ratio_min=float(c["ratio_min"]),
                                   n_children=int(c["children"]), top_m=int(settings["teacher_pass"]["top_m"]),
                                   h_trunc=settings["teacher_pass"]["h_trunc"])
        length = int(spine["spine_length"])
        for k, cand in enumerate(chosen):
            at = g.iloc[cand.position]
            rows.append({
                "dataset": spine["dataset"], "problem_id": spine["problem_id"], "candidate": k,
                "position": cand.position, "spine_length": length, "r_tilde": (cand.position + 0.5) / length,
                "boxed_start": -1 if start is None else start, "h_trunc": cand.entropy, "entropy": float(at["entropy"]),
                "p1": cand.p1, "p2": cand.p2, "spine_token": int(at["token_id"]), "children": list(cand.children),
                "children_text": [tokenizer.decode([i]) for i in cand.children],
            })
    return pd.DataFrame(rows, columns=[*CANDIDATE_KEY, "position", "spine_length", "r_tilde", "boxed_start", "h_trunc",
                                       "entropy", "p1", "p2", "spine_token", "children", "children_text"])


# ---------------------------------------------------------------------------------------------
# Phase D: MC dropout


def mc_seed(base: int, dataset: str, problem_id: str) -> int:
    """Seed of the default torch generator for one problem's MC-dropout passes."""
    return (int(base) * 1_000_003 + zlib.crc32(f"{dataset}/{problem_id}".encode())) % (2**63)


def run_mc_dropout(model, tokenizer, spines: pd.DataFrame, candidates: pd.DataFrame, settings: dict) -> pd.DataFrame:
    """M dropout-perturbed teacher forwards per problem (dropout on the outputs of the last layers,
    hooks removed afterwards); at each candidate position the full-vocabulary distributions give
    H_full, MI and the raw moment-matched Dirichlet precision."""
    import torch

    md = settings["mc_dropout"]
    m = int(md["samples"])
    spine_rows = spines.set_index(PROBLEM_KEY)
    rows = []
    head = model.get_output_embeddings().weight
    n_layers = len(decoder_layers(model, settings["layers"]))
    if int(md["last_layers"]) > n_layers:
        raise DiagnosticError(f"diagnostic.mc_dropout.last_layers: {md['last_layers']} but the model has {n_layers} layers")
    for (dataset, pid), cands in candidates.groupby(PROBLEM_KEY, sort=False):
        spine = spine_rows.loc[(dataset, pid)]
        prompt = teacher_prompt_ids(tokenizer, spine, kind=settings["teacher_prompt"], chat_template=settings["chat_template"])
        positions = [int(p) for p in cands["position"]]
        ids = prompt + list(spine["spine_ids"])[: max(positions)]
        at = torch.tensor([len(prompt) - 1 + p for p in positions])
        torch.manual_seed(mc_seed(md["seed"], dataset, pid))
        samples = []
        with torch.no_grad(), mc_dropout(model, last_layers=int(md["last_layers"]), p=float(md["p"]), layers=settings["layers"]):
            for _ in range(m):
                h = last_hidden_states(model, ids)[at.to(head.device)]
                samples.append(torch.softmax((h @ head.T).float(), dim=-1).double().cpu().numpy())
        probs = np.stack(samples)  # [M, n_candidates, V]
        for k, (_, cand) in enumerate(cands.iterrows()):
            rows.append({"dataset": dataset, "problem_id": pid, "candidate": int(cand["candidate"]),
                         **stats.mc_dropout_scores(probs[:, k, :]), "mc_samples": m})
    return pd.DataFrame(rows, columns=[*CANDIDATE_KEY, "h_full", "mi", "kappa", "mc_samples"])


# ---------------------------------------------------------------------------------------------
# Phase E: forced continuations


def forced_continuation_plan(spines: pd.DataFrame, candidates: pd.DataFrame, settings: dict
                             ) -> tuple[list[GenerationRequest], list[dict[str, Any]]]:
    """One request per (candidate, child): student prompt + spine[:position] + child, ``n``
    continuations; child ``j`` of the ``i``-th candidate gets seeds ``seed + (i*children + j)*n + k``,
    so no two continuations share a seed."""
    fc = settings["forced_continuation"]
    n, n_children = int(fc["n"]), int(settings["candidates"]["children"])
    spine_rows = spines.set_index(PROBLEM_KEY)
    requests, keys = [], []
    for i, (_, cand) in enumerate(candidates.iterrows()):
        spine = spine_rows.loc[(cand["dataset"], cand["problem_id"])]
        reqs = forced_continuation_requests(spine["prompt_ids"], spine["spine_ids"], int(cand["position"]), cand["children"],
                                            n=n, seed=int(fc["seed"]) + i * n_children * n, seed_stride=n,
                                            temperature=float(fc["temperature"]), top_p=float(fc["top_p"]),
                                            max_model_len=int(fc["max_model_len"]), max_new_tokens=fc.get("max_new_tokens"))
        for j, (req, child) in enumerate(zip(reqs, cand["children"])):
            requests.append(req)
            keys.append({"dataset": cand["dataset"], "problem_id": cand["problem_id"], "candidate": int(cand["candidate"]),
                         "child_rank": j, "child_id": int(child)})
    return requests, keys


# ---------------------------------------------------------------------------------------------
# Phase F: labels


def label_candidate(viabilities: Sequence[float], *, v_high: float = 0.75, v_low: float = 0.40) -> str:
    """Diversity if at least two children have viability >= v_high; real-uncertain if every child
    is below v_low and so is their mean; gray otherwise (excluded from the AUROC)."""
    v = np.asarray(viabilities, dtype=float)
    if int((v >= v_high).sum()) >= 2:
        return stats.DIVERSITY
    if len(v) and bool((v < v_low).all()) and float(v.mean()) < v_low:
        return stats.REAL_UNCERTAIN
    return stats.GRAY


def label_candidates(candidates: pd.DataFrame, continuations: pd.DataFrame, spines: pd.DataFrame, settings: dict, *,
                     grade) -> pd.DataFrame:
    """Child viability = fraction of its continuations whose boxed answer is correct; the
    candidate's label from its children's viabilities (:func:`label_candidate`). A continuation's
    answer is read from the forced child's text followed by the continuation (``child_text`` +
    ``text``): a child that opens the answer (``\\boxed``, or its first piece) leaves the
    continuation's own text without it."""
    lab = settings["labels"]
    gold = spines.set_index(PROBLEM_KEY)["answer"]
    if len(continuations) and "child_text" not in continuations:
        raise ValueError("the forced continuations have no child_text column (made by an older version): "
                         "run the forced_continuation rule again")
    cont = continuations.copy()
    cont["extracted"] = [extract_boxed(c + t) for c, t in zip(cont.get("child_text", []), cont["text"])]
    golds = [gold.loc[(d, p)] for d, p in zip(cont["dataset"], cont["problem_id"])]
    cont["correct"] = grade(list(cont["extracted"]), golds) if len(cont) else []
    per_child = (cont.groupby([*CANDIDATE_KEY, "child_rank"], sort=True)["correct"]
                 .agg(viability="mean", n_continuations="size").reset_index())
    rows = []
    by_cand = {k: g for k, g in per_child.groupby(CANDIDATE_KEY, sort=False)}
    for _, cand in candidates.iterrows():
        g = by_cand.get((cand["dataset"], cand["problem_id"], int(cand["candidate"])))
        v = [] if g is None else [float(x) for x in g.sort_values("child_rank")["viability"]]
        label = label_candidate(v, v_high=float(lab["v_high"]), v_low=float(lab["v_low"])) if v else stats.GRAY
        rows.append({"dataset": cand["dataset"], "problem_id": cand["problem_id"], "candidate": int(cand["candidate"]),
                     "viabilities": v, "mean_viability": float(np.mean(v)) if v else float("nan"),
                     "n_continuations": 0 if g is None else int(g["n_continuations"].sum()), "label": label})
    return pd.DataFrame(rows, columns=[*CANDIDATE_KEY, "viabilities", "mean_viability", "n_continuations", "label"])

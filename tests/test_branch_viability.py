"""The diagnostic's phases on tables (pwopsd.diagnostic.phases): problem draw, token filter, \\boxed
position, spines with the fallback, teacher pass + candidates, MC dropout, forced-continuation
plan, labels with the real grader, Phase G summary (degenerate pools included), Table 1 and the
figure's binning."""

import json

import numpy as np
import pandas as pd
import pytest

from pwopsd.diagnostic import phases as bv
from pwopsd.diagnostic import scores
from pwopsd.diagnostic import statistics as stats
from pwopsd.config import diagnostic_settings, load_config
from pwopsd.diagnostic.branch_points import truncated_entropy
from pwopsd.evaluation.grading import grade_answers
from pwopsd.io import partial_dir
from conftest import REPO


@pytest.fixture(scope="module")
def settings():
    cfg = load_config(REPO / "tiny" / "config" / "config.yaml")
    s = diagnostic_settings(cfg, "tiny_qwen3")
    s["spine"] = {**s["spine"], "max_new_tokens": 12}
    s["mc_dropout"] = {**s["mc_dropout"], "last_layers": 2}
    s["candidates"] = {**s["candidates"], "p2_min": 0.0, "ratio_min": 0.0, "spacing": 2}
    return s


def bench(n, prefix):
    return pd.DataFrame({"id": [f"{prefix}-{i}" for i in range(n)], "problem": [f"Compute {i} + 1." for i in range(n)],
                         "answer": [str(i + 1) for i in range(n)], "solution": [f"{i} + 1 = {i + 1}" for i in range(n)]})


@pytest.mark.vllm_stack
def test_problem_draw_is_seeded_without_replacement():
    tables = {"a": bench(30, "a"), "b": bench(10, "b")}
    one = bv.sample_problems(tables, {"a": 8, "b": 10}, seed=0)
    assert one.equals(bv.sample_problems(tables, {"a": 8, "b": 10}, seed=0))
    assert not one.equals(bv.sample_problems(tables, {"a": 8, "b": 10}, seed=1))
    a = one[one.dataset == "a"]
    assert len(a) == 8 and a["problem_id"].is_unique and set(one[one.dataset == "b"]["problem_id"]) == set(tables["b"]["id"])
    assert (a["answer"] == a["problem_id"].map(tables["a"].set_index("id")["answer"])).all()
    with pytest.raises(bv.DiagnosticError, match="diagnostic.datasets.b: asks for 11 problems"):
        bv.sample_problems(tables, {"b": 11}, seed=0)


@pytest.mark.vllm_stack
def test_token_filter_drops_special_and_junk(tiny_tokenizer):
    keep = bv.TokenFilter(tiny_tokenizer)
    ids = {t: tiny_tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|im_start|>", "<|endoftext|>", "<think>")}
    assert not any(keep(i) for i in ids.values())
    digit = tiny_tokenizer.encode("7", add_special_tokens=False)[0]
    newline = tiny_tokenizer.encode("\n", add_special_tokens=False)[0]
    assert keep(digit) and keep(newline) and not bv.TokenFilter(tiny_tokenizer, drop_whitespace=True)(newline)
    partial_byte = tiny_tokenizer.convert_tokens_to_ids("Ã")  # byte-level symbol of a lone UTF-8 lead byte
    assert not keep(partial_byte)
    arr = np.array([[digit, ids["<think>"]], [newline, digit]])
    np.testing.assert_array_equal(keep.mask(arr), [[True, False], [True, True]])


@pytest.mark.vllm_stack
def test_boxed_start_is_the_token_where_boxed_begins(tiny_tokenizer):
    text = "<think>\n2 + 3 = 5\n</think>\n\nThe answer is \\boxed{5}. Again \\boxed{5}."
    ids = tiny_tokenizer.encode(text, add_special_tokens=False)
    got = bv.boxed_start(tiny_tokenizer, ids)
    brute = next(t for t in range(len(ids)) if len(tiny_tokenizer.decode(ids[: t + 1])) > text.index("\\boxed"))
    assert got == brute
    assert "\\boxed" not in tiny_tokenizer.decode(ids[:got]) and tiny_tokenizer.decode(ids[:got + 1]).count("\\boxed") <= 1
    assert bv.boxed_start(tiny_tokenizer, tiny_tokenizer.encode("no answer", add_special_tokens=False)) is None


def grade(predictions, golds):
    return grade_answers(predictions, golds, workers=1, timeout=10)


@pytest.fixture(scope="module")
def spines(random_tiny_model, tiny_tokenizer, settings, tmp_path_factory):
    from pwopsd.generation.hf_backend import HFBackend

    problems = bv.sample_problems({"a": bench(6, "a")}, {"a": 3}, seed=0)
    backend = HFBackend(random_tiny_model, tiny_tokenizer, batch_size=8)
    out = tmp_path_factory.mktemp("spines") / "spines.parquet"
    return bv.run_spines(backend, tiny_tokenizer, problems, settings, grade=grade,
                         partial_root=lambda key, part: partial_dir(out, key, part))


def test_spines_fall_back_when_greedy_has_no_boxed(spines, random_tiny_model, tiny_tokenizer, settings, tmp_path):
    from pwopsd.generation.hf_backend import HFBackend

    # A random model never writes \boxed{...}: every spine is the seeded T=0.7 fallback, graded wrong.
    assert list(spines["decoding"]) == ["fallback"] * 3 and not spines["correct"].any()
    assert (spines["spine_length"] == spines["spine_ids"].map(len)).all()
    assert (spines["spine_length"] <= 12).all() and (spines["spine_length"] > 0).all()
    special = bv.TokenFilter(tiny_tokenizer).special
    assert all(not ids or ids[-1] not in special for ids in spines["spine_ids"])
    expected = bv.student_prompt_ids(tiny_tokenizer, spines["problem"].iloc[0], kind="eval",
                                     chat_template=settings["chat_template"])
    assert list(spines["prompt_ids"].iloc[0]) == expected
    # The fallback is the seeded T=0.7 rollout of the same prompt, on a stream of its own (the
    # fallbacks share diagnostic.spine.seed).
    from pwopsd.generation import GenerationRequest

    direct = HFBackend(random_tiny_model, tiny_tokenizer).generate(
        [GenerationRequest(tuple(expected), n=1, seed=0, temperature=0.7, top_p=1.0, max_new_tokens=12,
                           streams="per_prompt")])[0][0]
    assert bv.strip_stop(direct.token_ids, special) == list(spines["spine_ids"].iloc[0])
    again = bv.run_spines(HFBackend(random_tiny_model, tiny_tokenizer, batch_size=2), tiny_tokenizer,
                          spines[["dataset", "problem_id", "problem", "answer", "solution"]], settings, grade=grade,
                          partial_root=lambda key, part: partial_dir(tmp_path / "spines.parquet", key, part))
    assert [list(x) for x in again["spine_ids"]] == [list(x) for x in spines["spine_ids"]]  # seeded, batch-independent


def test_spines_stop_on_notice_at_a_shard_boundary_and_resume(spines, random_tiny_model, tiny_tokenizer, settings, tmp_path):
    """A notice signal during the spines' first shard (Slurm's warning, time limit or preemption):
    that shard is kept, the phase stops with Interrupted before the next, and the rerun ends with
    the spines of an uninterrupted run."""
    import os
    import signal

    from pwopsd.generation.hf_backend import HFBackend
    from pwopsd.notice import Interrupted, Notice

    problems = spines[["dataset", "problem_id", "problem", "answer", "solution"]]

    class Signalled(HFBackend):
        calls = 0

        def generate(self, requests):
            self.calls += 1
            if self.calls == 1:
                os.kill(os.getpid(), signal.SIGTERM)
            return super().generate(requests)

    root = lambda key, part: partial_dir(tmp_path / "spines.parquet", key, part)  # noqa: E731
    backend = Signalled(random_tiny_model, tiny_tokenizer, batch_size=8)
    with Notice() as notice, pytest.raises(Interrupted, match="1 of 2 shards saved"):
        bv.run_spines(backend, tiny_tokenizer, problems, settings, grade=grade, partial_root=root, shard_size=2,
                      notice=notice)
    assert backend.calls == 1
    rerun = Signalled(random_tiny_model, tiny_tokenizer, batch_size=8)
    rerun.calls = 1  # no signal this time
    again = bv.run_spines(rerun, tiny_tokenizer, problems, settings, grade=grade, partial_root=root, shard_size=2)
    assert rerun.calls == 1 + 1 + 2  # the greedy pass's second shard, then the fallback's two
    pd.testing.assert_frame_equal(again, spines)


def test_teacher_pass_and_candidates(spines, random_tiny_model, tiny_tokenizer, settings):
    import torch

    teacher = bv.run_teacher_pass(random_tiny_model, tiny_tokenizer, spines, settings)
    assert len(teacher) == spines["spine_length"].sum()
    row = teacher.iloc[3]
    valid = bv.TokenFilter(tiny_tokenizer).mask(np.asarray(row["top_ids"]))
    assert row["h_trunc"] == pytest.approx(truncated_entropy(row["top_probs"], valid, 16), abs=1e-6)
    assert np.all(np.diff(row["top_probs"]) <= 1e-7)  # sorted descending
    cands = bv.run_candidates(tiny_tokenizer, spines, teacher, settings)
    assert len(cands) > 0
    for (d, p), g in cands.groupby(["dataset", "problem_id"]):
        pos = sorted(g["position"])
        assert len(pos) <= 5 and all(b - a >= 2 for a, b in zip(pos, pos[1:]))
    keep = bv.TokenFilter(tiny_tokenizer)
    assert all(len(c) == 3 and all(keep(i) for i in c) for c in cands["children"])
    np.testing.assert_allclose(cands["r_tilde"], (cands["position"] + 0.5) / cands["spine_length"])
    # MC dropout: seeded (same numbers twice), hooks gone afterwards, scores finite.
    x = torch.tensor([list(spines["prompt_ids"].iloc[0])])
    with torch.no_grad():
        before = random_tiny_model(input_ids=x).logits
    mc1 = bv.run_mc_dropout(random_tiny_model, tiny_tokenizer, spines, cands, settings)
    mc2 = bv.run_mc_dropout(random_tiny_model, tiny_tokenizer, spines, cands, settings)
    with torch.no_grad():
        assert torch.equal(random_tiny_model(input_ids=x).logits, before)
    pd.testing.assert_frame_equal(mc1, mc2)
    assert len(mc1) == len(cands) and np.isfinite(mc1[["h_full", "mi"]].to_numpy()).all() and (mc1["mi"] >= -1e-12).all()
    # Phase E plan: student prompt + spine prefix + child; no two continuations share a seed.
    requests, keys = bv.forced_continuation_plan(spines, cands, settings)
    assert len(requests) == 3 * len(cands)
    k = keys[4]
    spine = spines.set_index(["dataset", "problem_id"]).loc[(k["dataset"], k["problem_id"])]
    pos = int(cands.set_index(["dataset", "problem_id", "candidate"]).loc[(k["dataset"], k["problem_id"], k["candidate"]), "position"])
    assert list(requests[4].prompt_ids) == list(spine["prompt_ids"]) + list(spine["spine_ids"][:pos]) + [k["child_id"]]
    seeds = [r.sample_seed(j) for r in requests for j in range(r.n)]
    assert len(set(seeds)) == len(seeds) and all(r.n == 6 and r.temperature == 1.0 and r.top_p == 0.95 for r in requests)
    # The paper's continuations run to the model length; a rehearsal caps them (beyond the paper).
    assert "max_new_tokens" not in settings["forced_continuation"]
    room = [int(settings["forced_continuation"]["max_model_len"]) - len(r.prompt_ids) for r in requests]
    assert [r.max_new_tokens for r in requests] == room
    capped = {**settings, "forced_continuation": {**settings["forced_continuation"], "max_new_tokens": 5}}
    assert {r.max_new_tokens for r in bv.forced_continuation_plan(spines, cands, capped)[0]} == {5}


def crafted_pool():
    """Two problems, three candidates with known children outcomes."""
    spines = pd.DataFrame({"dataset": ["a", "a"], "problem_id": ["p0", "p1"], "answer": ["12", "\\frac{1}{2}"],
                           "correct": [True, True], "decoding": ["greedy", "greedy"]})
    cands = pd.DataFrame({"dataset": "a", "problem_id": ["p0", "p0", "p1"], "candidate": [0, 1, 0],
                          "position": [10, 90, 5], "spine_length": 100, "children": [[1, 2, 3]] * 3})
    cands["r_tilde"] = (cands["position"] + 0.5) / 100
    right, wrong = "so \\boxed{12}", "so \\boxed{13}"
    # p0 c0's second child is the token that opens the answer: its continuations hold only "{12}."
    # and are right as the child's text followed by theirs
    outcomes = {(0, 0): [right] * 5 + [wrong], (0, 1): ["{12}."] * 6, (0, 2): [wrong] * 6,   # p0 c0: 5/6, 1, 0 -> diversity
                (1, 0): [wrong] * 5 + [right], (1, 1): [wrong] * 6, (1, 2): ["no box"] * 6}  # p0 c1: all < 0.4 -> real-uncertain
    rows = [{"dataset": "a", "problem_id": "p0", "candidate": c, "child_rank": j, "child_id": j, "sample_index": k, "text": t,
             "child_text": "\\boxed" if (c, j) == (0, 1) else " "}
            for (c, j), texts in outcomes.items() for k, t in enumerate(texts)]
    # p1: answer 1/2, children 0.5 ("0.5" is equivalent), 0.5, 0.5 -> gray (not >= 0.75 twice, mean not < 0.4)
    rows += [{"dataset": "a", "problem_id": "p1", "candidate": 0, "child_rank": j, "child_id": j, "sample_index": k,
              "text": "\\boxed{0.5}" if k % 2 else "\\boxed{2}", "child_text": " "} for j in range(3) for k in range(6)]
    return spines, cands, pd.DataFrame(rows)


@pytest.mark.vllm_stack
def test_labels_from_graded_continuations(settings):
    spines, cands, cont = crafted_pool()
    labels = bv.label_candidates(cands, cont, spines, settings, grade=grade)
    assert list(labels["label"]) == [stats.DIVERSITY, stats.REAL_UNCERTAIN, stats.GRAY]
    assert labels["viabilities"].iloc[0] == pytest.approx([5 / 6, 1.0, 0.0])
    assert labels["viabilities"].iloc[2] == pytest.approx([0.5, 0.5, 0.5])
    assert list(labels["n_continuations"]) == [18, 18, 18]
    with pytest.raises(ValueError, match="child_text"):  # a table made before the child's text was kept
        bv.label_candidates(cands, cont.drop(columns="child_text"), spines, settings, grade=grade)


def summary_for(labels, correct=(True,) * 4, kappa=None, orientation="raw"):
    n = len(labels)
    problems = [f"p{i // 2}" for i in range(n)]
    spines = pd.DataFrame({"dataset": "a", "problem_id": sorted(set(problems)), "decoding": "greedy"})
    spines["correct"] = list(correct)[: len(spines)]
    cands = pd.DataFrame({"dataset": "a", "problem_id": problems, "candidate": [i % 2 for i in range(n)],
                          "position": np.arange(n) * 7 % 50, "spine_length": 50, "h_trunc": np.linspace(0.1, 2.0, n)})
    cands["r_tilde"] = (cands["position"] + 0.5) / 50
    mc = cands[["dataset", "problem_id", "candidate"]].assign(h_full=np.cos(np.arange(n)), mi=np.sin(np.arange(n)) ** 2,
                                                              kappa=kappa if kappa is not None else np.arange(n) - 2.0, mc_samples=5)
    lab = cands[["dataset", "problem_id", "candidate"]].assign(viabilities=[[0.0]] * n, mean_viability=0.0, n_continuations=6,
                                                               label=labels)
    scored = scores.scored_candidates(spines, cands, mc, lab)
    settings = {"scores": {"correct_spines_only": True, "n_boot": 200, "seed": 0, "level": 0.95, "orientation": orientation},
                "labels": {"v_high": 0.75, "v_low": 0.4}, "teacher_pass": {"top_m": 16}}
    return scored, scores.branch_auroc_summary(scored, spines, settings)


def test_summary_matches_the_statistics_functions():
    R, D, G = stats.REAL_UNCERTAIN, stats.DIVERSITY, stats.GRAY
    scored, summary = summary_for([R, D, D, R, R, D, G, D])
    assert summary["status"] == "ok"
    c = summary["counts"]
    assert (c["real_uncertain"], c["diversity"], c["gray"], c["problems_labelled"]) == (3, 4, 1, 4)
    binary = scored[scored["label"] != G]
    y = (binary["label"] == R).astype(int)
    groups = binary["problem_id"]
    for row in summary["scores"]:
        s = binary[row["score"]].to_numpy()
        assert row["auroc"] == pytest.approx(stats.residualized_auroc(s, y, groups))
        lo, hi = stats.cluster_bootstrap_ci(s, y, ("a/" + groups).to_numpy(), n_boot=200, seed=0)
        assert (row["ci_low"], row["ci_high"]) == pytest.approx((lo, hi)) == (row["ci_low_raw"], row["ci_high_raw"])
        flo, fhi = stats.cluster_bootstrap_ci(s, y, ("a/" + groups).to_numpy(), n_boot=200, seed=0, orientation="folded")
        assert (row["ci_low_folded"], row["ci_high_folded"]) == pytest.approx((flo, fhi))
        assert row["auroc_folded"] == pytest.approx(max(row["auroc"], 1 - row["auroc"]))
    folded = summary_for([R, D, D, R, R, D, G, D], orientation="folded")[1]
    assert folded["orientation"] == "folded" and [r["auroc"] for r in folded["scores"]] == [r["auroc_folded"] for r in summary["scores"]]
    assert "h_trunc" in summary["scores"][3]["score"] and "top-$16$" in summary["scores"][3]["label"]
    # log kappa: log max(kappa, 1e-6), so negative raw kappas share the floor.
    assert scored["log_kappa"].iloc[0] == pytest.approx(np.log(1e-6)) and scored["log_kappa"].iloc[4] == pytest.approx(np.log(2))
    np.testing.assert_allclose(scored["early_position"], 1 - scored["r_tilde"])


def test_an_infinite_dropout_precision_is_missing_not_ranked():
    """Identical MC-dropout samples give kappa = inf (no spread); centred, inf - inf is NaN, which
    would sort as the top score: the log kappa row is n/a with its missing count, the others stand."""
    R, D = stats.REAL_UNCERTAIN, stats.DIVERSITY
    assert stats.mc_dropout_scores(np.tile([0.6, 0.4], (5, 1)))["kappa"] == np.inf
    kappa = np.arange(8) - 2.0
    kappa[3] = np.inf
    _, summary = summary_for([R, D, D, R, R, D, D, R], kappa=kappa)
    rows = {r["score"]: r for r in summary["scores"]}
    assert rows["log_kappa"]["n_missing"] == 1 and rows["log_kappa"]["auroc"] is None
    assert all(r["auroc"] is not None and r["n_missing"] == 0 for k, r in rows.items() if k != "log_kappa")
    from pwopsd.report.tables import branch_auroc_table

    assert "n/a (1 missing) & n/a" in branch_auroc_table(summary, model_label="Toy")  # the row says why


@pytest.mark.parametrize("labels,correct,status", [
    (["diversity"] * 4, (True, True), "no real-uncertain candidates"),
    (["real_uncertain"] * 4, (True, True), "no diversity candidates"),
    (["gray"] * 4, (True, True), "every candidate is gray"),
    (["real_uncertain", "diversity"] * 2, (False, False), "no spine is correct"),
])
def test_degenerate_pools_say_so(labels, correct, status):
    _, summary = summary_for(labels, correct)
    assert summary["status"].startswith(status)
    assert all(r["auroc"] is None and r["ci_low"] is None for r in summary["scores"])
    json.dumps(summary, allow_nan=False)  # no NaN passed off as a number


def test_problem_with_one_candidate_and_table_rendering():
    from pwopsd.report.tables import branch_auroc_table

    R, D = stats.REAL_UNCERTAIN, stats.DIVERSITY
    _, summary = summary_for([R, D, D, R, R])  # the third problem has a single candidate
    assert summary["status"] == "ok" and all(r["auroc"] is not None for r in summary["scores"])
    tex = branch_auroc_table(summary, model_label="Toy")
    assert "separating $3$ \\emph{real-uncertain}" in tex and "from $2$ \\emph{diversity}" in tex
    assert "across $3$ problems" in tex and tex.count("\\\\") == 6 and "\\mathbf" in tex
    _, bad = summary_for(["diversity"] * 4)
    tex = branch_auroc_table(bad, model_label="Toy")
    assert tex.count("n/a & n/a") == 5 and "Not computable: no real-uncertain candidates" in tex


def test_binned_failure_rates():
    values = np.array([0.05, 0.15, 0.55, 0.95, 0.99])
    failure = np.array([1.0, 0.0, 0.5, 0.0, 1.0])
    width = stats.binned_rates(values, failure, 2, quantile=False)
    assert list(width["n"]) == [2, 3] and width["failure_rate"].tolist() == pytest.approx([0.5, 0.5])
    quant = stats.binned_rates(values, failure, 5, quantile=True)
    assert quant["n"].sum() == 5 and (quant["n"] == 1).all()
    assert quant["failure_rate"].tolist() == [1.0, 0.0, 0.5, 0.0, 1.0]

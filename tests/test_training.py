"""The training loop: sequence assembly as the reference does it, a loss that moves, and a killed
run that resumes from its last checkpoint to the same final adapter as an uninterrupted run."""

import json

import pytest
import torch

from conftest import paper_train_config
from pwopsd.evaluation.grading import integer_answer
from pwopsd.tiny.arithmetic import sample_problems
from pwopsd.training.loop import Example, TrainConfig, Trainer, assemble, canonical_adapter_config, data_order


def test_assemble_keeps_the_reference_layout():
    b = assemble([[5, 6, 7], [8]], [[10, 11, 2], [12]], pad_id=0)
    assert b["input_ids"].tolist() == [[5, 6, 7, 10, 11, 2], [8, 0, 0, 12, 0, 0]]
    assert b["attention_mask"].tolist() == [[1, 1, 1, 1, 1, 1], [1, 0, 0, 1, 0, 0]]
    assert b["position_ids"].tolist() == [[0, 1, 2, 3, 4, 5]] * 2  # prompt-PAD gap kept
    assert b["mask"].tolist() == [[1, 1, 1], [1, 0, 0]]  # EOS (2) supervised, padding not
    c = assemble([[5, 6, 7], [8]], [[10, 11, 2], [12]], pad_id=0, position_mode="contiguous")
    assert c["position_ids"][1].tolist() == [0, 0, 0, 1, 1, 1]


def test_the_teacher_message_follows_the_teacher_prompt_and_transition_switches():
    """training.teacher_prompt and training.teacher_transition pick the teacher's message: privileged
    with or without the transition paragraph, no_solution the same template with an empty solution."""
    from pwopsd import prompts
    from pwopsd.training.inputs import teacher_message_for

    example = Example(problem="Compute 9 + 6.", solution="9 + 6 = 15", answer="15")
    assert teacher_message_for(example, "privileged") == prompts.teacher_message("Compute 9 + 6.", "9 + 6 = 15")
    assert teacher_message_for(example, "privileged", transition=False) == prompts.teacher_message(
        "Compute 9 + 6.", "9 + 6 = 15", transition=False)
    assert teacher_message_for(example, "no_solution", transition=False) == prompts.teacher_message(
        "Compute 9 + 6.", "", transition=False)
    assert teacher_message_for(example, "privileged") != teacher_message_for(example, "privileged", transition=False)


def test_data_order_is_a_seeded_permutation_per_epoch():
    o = data_order(5, seed=42, epochs=2)
    assert sorted(o[:5]) == sorted(o[5:]) == list(range(5))
    assert (o == data_order(5, seed=42, epochs=2)).all() and not (o == data_order(5, seed=1, epochs=2)).all()


def _examples(n=64):
    return [Example(p.problem, p.reference_solution(), str(p.answer)) for p in sample_problems(3, n, [1, 2], 20)]


def _check(texts, answers):
    return [str(integer_answer(t)) == a for t, a in zip(texts, answers)]


def _trainer(model_factory, tok, work_dir, method="pwopsd", steps=4, stop_at=None, **overrides):
    cfg = paper_train_config(method, lora_r=4, lora_alpha=8, lr=1e-3, max_steps=steps, save_every=2, per_device_batch_size=4,
                      gradient_accumulation_steps=2, max_completion_length=12, chunk_size=16, seed=7,
                      stop_at=stop_at or steps, **overrides)
    return Trainer(model_factory(), tok, _examples(), cfg, work_dir, add_special_tokens=False, answer_check=_check)


@pytest.fixture()
def model_factory(random_tiny_model):
    state = {k: v.clone() for k, v in random_tiny_model.state_dict().items()}

    def make():
        import copy

        m = copy.deepcopy(random_tiny_model)
        m.load_state_dict(state)
        return m

    return make


@pytest.mark.parametrize("method", ["opsd", "eopd", "reopold", "gkd", "todi"])
def test_every_method_trains_and_logs(tmp_path, model_factory, tiny_tokenizer, method):
    tr = _trainer(model_factory, tiny_tokenizer, tmp_path, method=method, steps=2)
    before = {k: v.clone() for k, v in tr.model.named_parameters() if v.requires_grad}
    history = tr.train()
    assert [h["step"] for h in history] == [1, 2]
    assert all(torch.isfinite(torch.tensor(h["loss"])) for h in history)
    changed = [k for k, v in tr.model.named_parameters() if v.requires_grad and not torch.equal(v, before[k])]
    assert changed  # the adapter moved
    logged = [json.loads(x) for x in (tmp_path / "train_log.jsonl").read_text().splitlines()]
    assert [x["step"] for x in logged] == [1, 2] and {"kl", "rollout_length", "rollout_accuracy", "lr"} <= set(logged[0])
    assert logged[-1]["lr"] == 0.0  # linear decay to 0 at max_steps


def _assert_same_adapter(a, b):
    """Two trainers hold the same LoRA weights, bit for bit."""
    wa = {k: v for k, v in a.model.named_parameters() if v.requires_grad}
    wb = {k: v for k, v in b.model.named_parameters() if v.requires_grad}
    assert wa.keys() == wb.keys() and wa
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k


@pytest.mark.parametrize("dropout", [0.0, 0.05])  # the reference's effective LoRA dropout, the paper's
def test_killed_run_resumes_to_the_same_adapter(tmp_path, model_factory, tiny_tokenizer, dropout):
    full = _trainer(model_factory, tiny_tokenizer, tmp_path / "full", lora_dropout=dropout)
    full.train()
    killed = _trainer(model_factory, tiny_tokenizer, tmp_path / "killed", lora_dropout=dropout)
    killed.train(stop_after=3)  # killed after step 3; the last checkpoint is step 2
    assert sorted(p.name for p in (tmp_path / "killed").glob("step-*")) == ["step-000002"]
    resumed = _trainer(model_factory, tiny_tokenizer, tmp_path / "killed", lora_dropout=dropout)
    resumed.train()
    assert resumed.step == 4
    _assert_same_adapter(full, resumed)
    steps = [json.loads(x)["step"] for x in (tmp_path / "killed" / "train_log.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]  # the redone step 3 is logged once


def _trained_state(trainer, work_dir):
    """What a finished run leaves: adapter and optimizer tensors, the step log (bytes)."""
    tensors = {f"adapter.{k}": v.detach().clone() for k, v in trainer.model.named_parameters() if v.requires_grad}
    for i, state in trainer.opt.state_dict()["state"].items():
        tensors.update({f"opt.{i}.{k}": v.clone() for k, v in state.items() if torch.is_tensor(v)})
    return tensors, (work_dir / "train_log.jsonl").read_bytes()


@pytest.mark.parametrize("signum,where", [("SIGTERM", "rollouts"), ("SIGUSR1", "loss"), ("SIGTERM", "between")])
def test_a_notice_signal_stops_after_its_step_with_a_checkpoint_and_the_rerun_is_bit_identical(
        tmp_path, model_factory, tiny_tokenizer, monkeypatch, signum, where):
    """Fault injection: a notice (Slurm's warning, its time limit, preemption) arrives during step
    3's rollouts, during its loss, or between steps 2 and 3: step 3 still finishes (nothing lost),
    its checkpoint is written, Interrupted is raised; the rerun resumes there and ends with the
    adapter, the optimizer state and the step log of an uninterrupted run, bit for bit."""
    import os
    import signal

    from pwopsd.training import loop
    from pwopsd.notice import Interrupted

    full = _trainer(model_factory, tiny_tokenizer, tmp_path / "full")
    full.train()
    run = _trainer(model_factory, tiny_tokenizer, tmp_path / "run")
    sig = getattr(signal, signum)
    real_rollouts, real_loss, real_save = loop.Trainer.rollouts, loop.method_loss, loop.Trainer.save

    def rollouts(self, idx, step):
        if where == "rollouts" and step == 2:  # 0-based: step 3's rollouts
            os.kill(os.getpid(), sig)
        return real_rollouts(self, idx, step)

    def method_loss(cfg, *args):
        if where == "loss" and args[-1] == 2:
            os.kill(os.getpid(), sig)
        return real_loss(cfg, *args)

    def save(self):
        out = real_save(self)
        if where == "between" and self.step == 2:
            os.kill(os.getpid(), sig)
        return out

    monkeypatch.setattr(loop.Trainer, "rollouts", rollouts)
    monkeypatch.setattr(loop, "method_loss", method_loss)
    monkeypatch.setattr(loop.Trainer, "save", save)
    before = signal.getsignal(sig)
    with pytest.raises(Interrupted) as stopped:
        run.train()
    assert stopped.value.step == 3 and run.step == 3
    assert sorted(p.name for p in (tmp_path / "run").glob("step-*")) == ["step-000002", "step-000003"]
    assert signal.getsignal(sig) == before  # the process's own handlers are back
    monkeypatch.undo()
    resumed = _trainer(model_factory, tiny_tokenizer, tmp_path / "run")
    resumed.train()
    (a, log_a), (b, log_b) = _trained_state(full, tmp_path / "full"), _trained_state(resumed, tmp_path / "run")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    strip = lambda raw: [{k: v for k, v in json.loads(x).items() if not k.endswith("seconds")} for x in raw.splitlines()]  # noqa: E731
    assert strip(log_a) == strip(log_b)  # every logged number but the timings


@pytest.mark.long
def test_a_run_stopped_early_is_the_full_runs_beginning_and_resumes_when_it_goes_on(tmp_path, model_factory, tiny_tokenizer):
    """training.stop_at: the steps done are those of the max_steps run (the schedule still spans
    max_steps), the stop step is saved, and raising stop_at continues from it to the same adapter."""
    full = _trainer(model_factory, tiny_tokenizer, tmp_path / "full", steps=4)
    full_history = full.train()
    early = _trainer(model_factory, tiny_tokenizer, tmp_path / "early", steps=4, stop_at=3)
    history = early.train()
    assert [h["step"] for h in history] == [1, 2, 3] and early.step == 3
    assert history[-1]["lr"] == pytest.approx(1e-3 * (1 - 3 / 4))  # not decayed to 0 at the stop
    assert [h["loss"] for h in history] == [h["loss"] for h in full_history[:3]]
    assert sorted(p.name for p in (tmp_path / "early").glob("step-*")) == ["step-000002", "step-000003"]
    resumed = _trainer(model_factory, tiny_tokenizer, tmp_path / "early", steps=4)
    resumed.train()
    assert resumed.step == 4
    _assert_same_adapter(full, resumed)


def _save_base(model, tokenizer, path, **kwargs):
    model.save_pretrained(path, **kwargs)
    tokenizer.save_pretrained(path)
    return path


def test_merged_adapter_reproduces_the_trained_model(tmp_path, model_factory, tiny_tokenizer):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pwopsd.training.merge import merge_lora_checkpoint

    tr = _trainer(model_factory, tiny_tokenizer, tmp_path / "run", steps=2)
    tr.train()
    # Make the adapter clearly non-trivial so that merging is exercised.
    with torch.no_grad():
        for name, p in tr.model.named_parameters():
            if "lora_B" in name:
                p.add_(0.05)
    tr.model.save_pretrained(tmp_path / "adapter")
    x = torch.tensor([tiny_tokenizer("Compute 4 + 5.")["input_ids"]])
    with torch.no_grad():
        expected = tr.model(input_ids=x).logits
        base = model_factory()
        assert not torch.allclose(base(input_ids=x).logits, expected, atol=1e-4)
    merge_lora_checkpoint(_save_base(base, tiny_tokenizer, tmp_path / "base"), tmp_path / "adapter", tmp_path / "merged",
                          "float32")
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    with torch.no_grad():
        torch.testing.assert_close(merged(input_ids=x).logits, expected, atol=1e-4, rtol=1e-4)
    assert (tmp_path / "merged" / "model.safetensors").exists()
    assert AutoTokenizer.from_pretrained(tmp_path / "merged")("1 + 1")["input_ids"] == tiny_tokenizer("1 + 1")["input_ids"]


@pytest.mark.parametrize("dtype, shard", [("float32", None), ("bfloat16", None), ("bfloat16", "60KB")])
def test_the_merge_writes_peft_merge_and_unload_weights_bit_for_bit(tmp_path, model_factory, tiny_tokenizer, dtype, shard):
    """merge_lora_checkpoint (safetensors to safetensors, no PEFT) against PEFT's merge_and_unload on
    the model loaded in the job's dtype: every tensor equal, a sharded base merged shard by shard."""
    from peft import LoraConfig, PeftModel, get_peft_model
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from pwopsd.training.merge import INDEX, merge_lora_checkpoint

    base = _save_base(model_factory(), tiny_tokenizer, tmp_path / "base", **({"max_shard_size": shard} if shard else {}))
    assert (base / INDEX).exists() == bool(shard)
    lora = get_peft_model(model_factory(), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"],
                                                      task_type="CAUSAL_LM"))
    with torch.no_grad():  # a non-trivial adapter: B is zero at initialization
        gen = torch.Generator().manual_seed(0)
        for name, p in lora.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    lora.save_pretrained(tmp_path / "adapter")
    merge_lora_checkpoint(base, tmp_path / "adapter", tmp_path / "ours", dtype)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=getattr(torch, dtype))
    PeftModel.from_pretrained(model, tmp_path / "adapter").merge_and_unload().save_pretrained(
        tmp_path / "peft", **({"max_shard_size": shard} if shard else {}))
    ours = {k: v for f in sorted((tmp_path / "ours").glob("*.safetensors")) for k, v in load_file(f).items()}
    peft = {k: v for f in sorted((tmp_path / "peft").glob("*.safetensors")) for k, v in load_file(f).items()}
    assert ours.keys() == peft.keys() and len(ours) > 10
    assert all(v.dtype == getattr(torch, dtype) for v in ours.values())
    assert [k for k in ours if not torch.equal(ours[k], peft[k])] == []
    before = {k: v.to(getattr(torch, dtype)) for f in base.glob("*.safetensors") for k, v in load_file(f).items()}
    changed = sorted(k for k, v in ours.items() if not torch.equal(v, before[k]))
    assert changed == sorted(k for k in ours if any(m in k for m in ("q_proj", "v_proj", "down_proj")))
    assert json.loads((tmp_path / "ours" / "config.json").read_text())["dtype"] == dtype
    assert (tmp_path / "ours" / "tokenizer.json").exists() and not (tmp_path / "ours" / "adapter_config.json").exists()


def test_the_merge_refuses_an_adapter_it_cannot_merge(tmp_path):
    from pwopsd.training.merge import MergeError, lora_scaling

    assert lora_scaling({"r": 8, "lora_alpha": 16}) == 2.0 and lora_scaling({"r": 4, "lora_alpha": 8, "use_rslora": True}) == 4.0
    with pytest.raises(MergeError, match="use_dora=True"):
        lora_scaling({"r": 8, "lora_alpha": 16, "use_dora": True})
    with pytest.raises(MergeError, match="modules_to_save"):
        lora_scaling({"r": 8, "lora_alpha": 16, "modules_to_save": ["lm_head"]})


def test_gradient_checkpointing_changes_neither_loss_nor_gradients(tmp_path, model_factory, tiny_tokenizer):
    from pwopsd.models import decoder_layers

    runs = {}
    for on in (False, True):
        cfg = paper_train_config("pwopsd", lora_r=4, lora_alpha=8, lr=1e-3, max_steps=1, per_device_batch_size=4,
                          gradient_accumulation_steps=2, max_completion_length=12, chunk_size=16, seed=7,
                          gradient_checkpointing=on)
        tr = Trainer(model_factory(), tiny_tokenizer, _examples(), cfg, tmp_path / str(on), add_special_tokens=False)
        calls = []
        for layer in decoder_layers(tr.model):
            if getattr(layer, "gradient_checkpointing", False):
                real = layer._gradient_checkpointing_func
                layer._gradient_checkpointing_func = lambda *a, _real=real, **kw: calls.append(1) or _real(*a, **kw)
        grads = {}
        params = [(k, v) for k, v in tr.model.named_parameters() if v.requires_grad]
        tr.opt.step = lambda: grads.update({k: v.grad.clone() for k, v in params})  # the step's (clipped) gradients
        stats = tr.train_step()
        runs[on] = (stats["loss"], grads, len(calls))
    assert runs[False][2] == 0 and runs[True][2] > 0  # recomputation really happened with the setting on
    assert runs[True][0] == pytest.approx(runs[False][0], rel=1e-6)
    for k, g in runs[False][1].items():
        torch.testing.assert_close(runs[True][1][k], g, rtol=1e-5, atol=1e-7)


def test_bf16_training_merging_and_generation_on_cpu(tmp_path, random_tiny_model, tiny_tokenizer):
    """The paper's dtype end to end on CPU: LoRA training on a bf16 base (OPSD's loss in bf16, as the
    reference; PW-OPSD), merging into a bf16 checkpoint, and bf16 generation from it."""
    import copy

    from transformers import AutoModelForCausalLM

    from pwopsd.generation import GenerationRequest
    from pwopsd.generation.hf_backend import HFBackend
    from pwopsd.training.merge import merge_lora_checkpoint

    def bf16_base():
        return copy.deepcopy(random_tiny_model).to(torch.bfloat16)

    trained = {}
    for method in ("opsd", "pwopsd"):
        cfg = paper_train_config(method, lora_r=4, lora_alpha=8, lr=1e-2, max_steps=2, save_every=2, per_device_batch_size=4,
                          gradient_accumulation_steps=1, max_completion_length=12, chunk_size=16, seed=7, opsd_upcast=False)
        tr = Trainer(bf16_base(), tiny_tokenizer, _examples(), cfg, tmp_path / method, add_special_tokens=False)
        lora = {k: v.clone() for k, v in tr.model.named_parameters() if v.requires_grad}
        history = tr.train()
        assert all(torch.isfinite(torch.tensor(h["loss"])) and h["loss"] != 0 for h in history)
        assert {v.dtype for v in lora.values()} == {torch.float32}  # LoRA weights in fp32 on the bf16 base
        assert {p.dtype for n, p in tr.model.named_parameters() if not p.requires_grad} == {torch.bfloat16}
        assert any(not torch.equal(v, lora[k]) for k, v in tr.model.named_parameters() if v.requires_grad)
        trained[method] = tr
    # OPSD's loss really ran in bf16: the fp32-upcast loss of the same batch differs. At the tiny
    # model's small per-token KL (~1e-3) bf16 rounding of the log-probabilities is of the same
    # order as the loss itself (measured: 2.9e-3 vs 1.3e-3), the reference's OPSD numerics.
    from pwopsd.training.loop import assemble, completion_hidden, method_loss

    tr = trained["opsd"]
    idx = tr.batch_indices(0)
    comps = tr.rollouts(idx[:4], 0)
    s = assemble([tr.student_ids[i] for i in idx[:4]], comps, tr.pad_id, position_mode="reference")
    t = assemble([tr.teacher_ids[i] for i in idx[:4]], comps, tr.pad_id, position_mode="reference")
    with torch.no_grad():
        h_s, h_t = completion_hidden(tr.inner.model, s), completion_hidden(tr.inner.model, t)
        weight = tr.inner.get_output_embeddings().weight
        assert h_s.dtype == torch.bfloat16
        bf = method_loss(tr.cfg, h_s, h_t, weight, s["completion"], s["mask"], 0)
        up = method_loss(TrainConfig(**{**tr.cfg.__dict__, "opsd_upcast": True}), h_s, h_t, weight, s["completion"],
                         s["mask"], 0)
    assert torch.isfinite(bf) and float(bf) != float(up) and abs(float(bf) - float(up)) < 1e-2
    # Merge the PW-OPSD adapter into a bf16 base and generate from the merged bf16 checkpoint.
    tr = trained["pwopsd"]
    tr.model.save_pretrained(tmp_path / "adapter")
    x = torch.tensor([tiny_tokenizer("Compute 4 + 5.")["input_ids"]])
    with torch.no_grad():
        expected = tr.model(input_ids=x).logits.float()
    merge_lora_checkpoint(_save_base(bf16_base(), tiny_tokenizer, tmp_path / "base"), tmp_path / "adapter",
                          tmp_path / "merged", "bfloat16")
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged", dtype=torch.bfloat16).eval()
    assert {p.dtype for p in merged.parameters()} == {torch.bfloat16}
    with torch.no_grad():
        torch.testing.assert_close(merged(input_ids=x).logits.float(), expected, atol=0.1, rtol=0.05)
    prompt = tuple(tiny_tokenizer("Compute 4 + 5.")["input_ids"])
    out = HFBackend(merged, tiny_tokenizer, batch_size=4).generate(
        [GenerationRequest(prompt, n=2, seed=1, temperature=1.0, top_p=0.95, max_new_tokens=8),
         GenerationRequest(prompt, n=1, temperature=0.0, max_new_tokens=8)])
    assert [len(o) for o in out] == [2, 1] and all(0 < len(c.token_ids) <= 8 for o in out for c in o)
    with torch.no_grad():
        reference = merged.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=8,
                                    pad_token_id=tiny_tokenizer.pad_token_id)[0, len(prompt):].tolist()
    assert out[1][0].token_ids == reference[: len(out[1][0].token_ids)]  # bf16 greedy = transformers' greedy


def test_a_saved_adapter_config_is_the_same_bytes_whatever_order_peft_wrote_its_modules(tmp_path):
    """PEFT writes target_modules from a set (in the order of the process's string hashes): two
    processes saving one run wrote different adapter_config.json files before they were sorted."""
    written = []
    for i, order in enumerate((["q_proj", "v_proj", "up_proj"], ["up_proj", "q_proj", "v_proj"])):
        path = tmp_path / f"{i}.json"
        path.write_text(json.dumps({"target_modules": order, "r": 8, "modules_to_save": None}, indent=2))
        canonical_adapter_config(path)
        written.append(path.read_bytes())
    assert written[0] == written[1]
    assert json.loads(written[0]) == {"target_modules": ["q_proj", "up_proj", "v_proj"], "r": 8, "modules_to_save": None}


# -- RNG states per rank, the deterministic switch, a step log two copies wrote (issue 41) ---------


def _draws():
    """A few numbers from every generator a rank's state holds (restoring a state = equal draws)."""
    import random

    import numpy as np

    return torch.rand(4).tolist(), np.random.rand(4).tolist(), [random.random() for _ in range(4)]


def _state_with(path, **changes):
    """Rewrite the trainer state of a checkpoint folder with ``changes``."""
    state = torch.load(path / "trainer_state.pt", weights_only=False)
    state.update(changes)
    torch.save(state, path / "trainer_state.pt")
    return state


def test_every_rank_resumes_its_own_rng_state_and_a_checkpoint_of_another_world_is_refused(tmp_path, model_factory,
                                                                                           tiny_tokenizer):
    """The checkpoint holds one RNG state per rank (index = rank); a rank restores its own. A
    checkpoint written by a world of another size is an error naming both sizes (the 2-process
    run itself: tests/test_train_launch.py)."""
    import random

    import numpy as np

    from pwopsd.training.loop import rank_rng_state, set_rank_rng_state

    tr = _trainer(model_factory, tiny_tokenizer, tmp_path)
    tr.step = 2
    ckpt = tr.save()
    saved = torch.load(ckpt / "trainer_state.pt", weights_only=False)
    assert "rng" not in saved and len(saved["rng_ranks"]) == 1 and set(saved["rng_ranks"][0]) == {"torch", "numpy", "python"}
    states = []
    for seed in (11, 12):  # two ranks' generators at different points
        torch.manual_seed(seed)
        np.random.seed(seed)
        random.seed(seed)
        states.append(rank_rng_state())
    _state_with(ckpt, rng_ranks=states)
    expected = []
    for s in states:
        set_rank_rng_state(s)
        expected.append(_draws())
    for rank in (1, 0):
        other = _trainer(model_factory, tiny_tokenizer, tmp_path)
        other.rank, other.world = rank, 2  # this process as rank `rank` of 2 (the RNG restore reads no collective)
        assert other.resume() and other.step == 2
        assert _draws() == expected[rank], rank
    three = _trainer(model_factory, tiny_tokenizer, tmp_path)
    three.rank, three.world = 0, 3
    with pytest.raises(RuntimeError, match=r"written by a run of 2 process\(es\) but this run has 3"):
        three.resume()


def test_a_checkpoint_of_the_old_layout_restores_its_one_rng_state(tmp_path, model_factory, tiny_tokenizer):
    """A checkpoint written before per-rank states (one ``rng`` dict) still resumes: its state is
    restored (on every rank, as before)."""
    from pwopsd.training.loop import rank_rng_state

    tr = _trainer(model_factory, tiny_tokenizer, tmp_path)
    tr.step = 2
    ckpt = tr.save()
    torch.manual_seed(99)
    old = rank_rng_state()
    expected = _draws()
    state = _state_with(ckpt, rng=old)
    del state["rng_ranks"]
    torch.save(state, ckpt / "trainer_state.pt")
    for rank in (0, 1):
        resumed = _trainer(model_factory, tiny_tokenizer, tmp_path)
        resumed.rank, resumed.world = rank, 2
        torch.manual_seed(5)  # anything else
        assert resumed.resume() and resumed.step == 2
        assert _draws() == expected


def test_the_cuda_generator_of_the_models_device_is_saved_and_restored(tmp_path, model_factory, tiny_tokenizer,
                                                                        monkeypatch, caplog):
    """With CUDA: the model device's CUDA generator round-trips. Without: a stand-in torch.cuda
    checks what the save and the resume do with it: the generator of the model's device (not the
    current one, not every device), saved in the rank's state and set back on that device on
    resume; a CPU run never touches CUDA; a state that cannot be restored is said in the log."""
    import logging

    from pwopsd.training import loop

    if torch.cuda.is_available():
        dev = torch.device("cuda", torch.cuda.current_device())
        state = loop.rank_rng_state(dev)
        assert "cuda" in state
        a = torch.rand(8, device=dev)
        loop.set_rank_rng_state(state, dev)
        assert torch.equal(torch.rand(8, device=dev), a)
        return
    calls = []
    generator = {"state": torch.tensor([7, 1, 3], dtype=torch.uint8)}

    def get_rng_state(device="cuda"):
        calls.append(("get", torch.device(device)))
        return generator["state"].clone()

    def set_rng_state(new_state, device="cuda"):
        calls.append(("set", torch.device(device), new_state.tolist()))

    monkeypatch.setattr(torch.cuda, "get_rng_state", get_rng_state)
    monkeypatch.setattr(torch.cuda, "set_rng_state", set_rng_state)
    gpu = torch.device("cuda", 1)  # the model's device is not the current device (0)
    assert "cuda" not in loop.rank_rng_state(torch.device("cpu")) and calls == []  # CPU training: no CUDA call
    tr = _trainer(model_factory, tiny_tokenizer, tmp_path)
    tr.device = gpu  # as a model on cuda:1 gives it
    tr.step = 2
    ckpt = tr.save()
    assert calls == [("get", gpu)]
    assert torch.load(ckpt / "trainer_state.pt", weights_only=False)["rng_ranks"][0]["cuda"].tolist() == [7, 1, 3]
    resumed = _trainer(model_factory, tiny_tokenizer, tmp_path)
    resumed.device = gpu
    real_load, loads = torch.load, []
    # saved by rank 0 from cuda:0: loaded onto the CPU, not to GPU 0 by every rank (memory held there
    # for the whole job); the states are then copied to the parameters' device
    monkeypatch.setattr(torch, "load", lambda *a, **kw: loads.append(kw.get("map_location")) or real_load(*a, **kw))
    resumed.resume()
    assert loads == ["cpu"]
    monkeypatch.setattr(torch, "load", real_load)
    assert calls[-1] == ("set", gpu, [7, 1, 3])
    n = len(calls)
    with caplog.at_level(logging.WARNING, logger="pwopsd.training.loop"):
        on_cpu = _trainer(model_factory, tiny_tokenizer, tmp_path)
        on_cpu.resume()  # a GPU checkpoint resumed on CPU: its CUDA state is not restored, and the log says so
        assert len(calls) == n and "holds a CUDA RNG state but this run trains on cpu" in caplog.text
        caplog.clear()
        loop.set_rank_rng_state(loop.rank_rng_state(torch.device("cpu")), gpu)  # a CPU (or old) state on a GPU
        assert len(calls) == n and "holds no CUDA RNG state" in caplog.text


@pytest.fixture()
def determinism_restored():
    """The process's determinism switches as they were before the test, and the cuBLAS variable."""
    import os

    saved = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
             torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic, os.environ.get("CUBLAS_WORKSPACE_CONFIG"))
    torch.use_deterministic_algorithms(False)
    os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
    yield
    torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
    torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = saved[2], saved[3]
    if saved[4] is None:
        os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
    else:
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = saved[4]


def test_the_deterministic_switch_sets_deterministic_algorithms_and_the_cublas_workspace(determinism_restored):
    import os

    from pwopsd.training.loop import set_determinism

    torch.backends.cudnn.benchmark = True
    set_determinism(False)  # off: PyTorch's defaults are left alone
    assert not torch.are_deterministic_algorithms_enabled() and "CUBLAS_WORKSPACE_CONFIG" not in os.environ
    assert torch.backends.cudnn.benchmark
    set_determinism(True)
    assert torch.are_deterministic_algorithms_enabled() and not torch.is_deterministic_algorithms_warn_only_enabled()
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert not torch.backends.cudnn.benchmark and torch.backends.cudnn.deterministic
    os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":16:8"  # the other deterministic setting, chosen by the user: kept
    set_determinism(True)
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"
    os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":0:0"  # not a deterministic one: replaced
    set_determinism(True)
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"


def test_a_deterministic_run_on_cpu_trains_the_default_runs_adapter(tmp_path, model_factory, tiny_tokenizer,
                                                                    determinism_restored):
    """training.deterministic on CPU: the Trainer switches deterministic algorithms on, no operation
    of the training path (rollouts, losses, backward, resume) lacks a deterministic CPU
    implementation, and the adapter is the default run's, bit for bit (CPU training is
    deterministic either way)."""
    default = _trainer(model_factory, tiny_tokenizer, tmp_path / "default", steps=2, lora_dropout=0.05)
    default.train()
    assert not torch.are_deterministic_algorithms_enabled()
    det = _trainer(model_factory, tiny_tokenizer, tmp_path / "deterministic", steps=2, lora_dropout=0.05, deterministic=True)
    assert torch.are_deterministic_algorithms_enabled()
    det.train()
    _assert_same_adapter(default, det)


def test_resume_keeps_one_line_per_step_of_a_log_two_copies_wrote(tmp_path, model_factory, tiny_tokenizer, caplog):
    """Two copies of one training wrote the folder: copy A ran steps 1-5, copy B (restarted from
    step 2's checkpoint) redid 3 and 4 and was cut in step 5's line; one line of step 5 is garbled.
    The resume from the surviving checkpoint (step 4) keeps the last line written of each step up
    to 4, in step order, says how many it dropped, and a resume of the clean log changes nothing."""
    import logging

    tr = _trainer(model_factory, tiny_tokenizer, tmp_path)
    tr.step = 4
    tr.save()

    def line(step, copy):
        return json.dumps({"step": step, "loss": step / 10, "copy": copy, "seconds": 1.0})

    written = [line(1, "A"), line(2, "A"), line(3, "A"), line(3, "B"), line(4, "A"), line(4, "B"), line(5, "A"),
               '{"step": 5, "loss": 0.5, "co{"step": 5, "loss"', line(5, "B")[:20]]  # the last one has no newline
    log_path = tmp_path / "train_log.jsonl"
    log_path.write_text("\n".join(written))
    with caplog.at_level(logging.WARNING, logger="pwopsd.training.loop"):
        resumed = _trainer(model_factory, tiny_tokenizer, tmp_path)
        assert resumed.resume() and resumed.step == 4
    expected = "".join(x + "\n" for x in (line(1, "A"), line(2, "A"), line(3, "B"), line(4, "B")))
    assert log_path.read_text() == expected
    assert "2 duplicate step line(s) and 1 unreadable line(s) dropped" in caplog.text
    assert not list(tmp_path.glob(".train_log.jsonl.*.tmp"))  # rewritten through its temporary file
    before = log_path.stat().st_mtime_ns
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="pwopsd.training.loop"):
        _trainer(model_factory, tiny_tokenizer, tmp_path).resume()
    assert log_path.read_text() == expected and log_path.stat().st_mtime_ns == before and "duplicate" not in caplog.text
    # rank > 0 never rewrites the log
    log_path.write_text("\n".join(written))
    other = _trainer(model_factory, tiny_tokenizer, tmp_path)
    other.rank, other.world = 1, 2
    _state_with(tmp_path / "step-000004", rng_ranks=torch.load(tmp_path / "step-000004" / "trainer_state.pt",
                                                                       weights_only=False)["rng_ranks"] * 2)
    other.resume()
    assert log_path.read_text() == "\n".join(written)


def test_a_rollout_that_would_not_fit_the_engines_context_stops_the_run_naming_the_setting():
    """vLLM ends a sequence that reaches max_model_len with finish reason "length": a context too
    short for the longest prompt plus max_completion_length would train on shorter rollouts, exit 0."""
    from pwopsd.training.loop import RolloutContextError, check_rollout_room

    check_rollout_room([93, 40], 1024, 1117, "step 3")  # fits exactly
    check_rollout_room([5000], 1024, None, "step 3")  # the hf backend: no engine context
    with pytest.raises(RolloutContextError) as info:
        check_rollout_room([93, 40], 1024, 1100, "step 3")
    line = str(info.value)
    assert "\n" not in line and "step 3:" in line and "93 tokens" in line and "training.rollout_max_model_len=1100" in line
    assert "at least 1117" in line


def test_a_run_whose_planned_prompts_would_not_fit_the_rollout_context_stops_before_its_first_step(
        model_factory, tiny_tokenizer, tmp_path):
    """The data order is fixed: every planned step's prompts are checked when training starts, not
    hours in at the step that holds the longest (whose retries would stop there again)."""
    from pwopsd.training.loop import RolloutContextError

    examples = [Example(p.problem, p.reference_solution(), str(p.answer)) for p in sample_problems(3, 8, [1, 2], 9)]
    examples[5] = Example(examples[5].problem + " and then" * 40, examples[5].solution, examples[5].answer)
    cfg = paper_train_config("opsd", lora_r=4, lora_alpha=8, max_steps=4, save_every=2, per_device_batch_size=2,
                             gradient_accumulation_steps=1, max_completion_length=8, chunk_size=8, seed=1,
                             rollout_backend="vllm", rollout_engine={"max_model_len": 120})
    # the check reads the config's engine context only: the Trainer's own hf rollouts stand in the
    # main environment, where vLLM is not installed (tests/vllm_cpu train with the engine itself)
    tr = Trainer(model_factory(), tiny_tokenizer, examples, cfg, tmp_path / "w", add_special_tokens=False)
    longest = max(len(tr.student_ids[i]) for i in range(len(examples)))
    assert longest + 8 > 120 > max(len(tr.student_ids[i]) for i in range(len(examples)) if i != 5) + 8
    with pytest.raises(RolloutContextError, match=r"steps 1 to 4: a student prompt of \d+ tokens"):
        tr.train()
    assert tr.step == 0 and not list((tmp_path / "w").glob("step-*"))

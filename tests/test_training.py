"""DeepMind-Mathematics data and from-scratch training of chapter 07 (lmdepth.data.dm_math, lmdepth.scratch.training):
generation with the run-time fixes, tokenizer and masks, the two objectives' loss masks, resume from a checkpoint,
the cached no-op, loss going down, and the exact-match metric. Tiny sizes, CPU."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from lmdepth.data import dm_math as dm
from lmdepth.data.dm_tokens import CharTokenizer, collate
from lmdepth.errors import DataError
from lmdepth.scratch import evaluate as ev
from lmdepth.scratch import training as tr
from lmdepth.scratch.models import build_model

MODULES = ("add_or_sub", "add_sub_multiple")


pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("dm")
    dm.load_or_generate(d, MODULES, n_train_per_module=60, n_eval_per_module=6, seed=0)
    return d


def cfg(arch="moeut", objective="lm", **kw):
    base = dict(modules=MODULES, n_train_per_module=60, n_eval_per_module=6, ckpt_every=2, steps=6, batch_size=4)
    return tr.run_config("smoke", arch, objective, **{**base, **kw})


# ---- data -------------------------------------------------------------------------------------------------------

@pytest.mark.unit
def test_generation_is_seeded_cached_and_split_correctly(data_dir):
    data = dm.load_or_generate(data_dir, MODULES, n_train_per_module=60, n_eval_per_module=6, seed=0)
    assert data.meta["seed"] == 0 and (data.path / "meta.json").exists()
    assert {e.module for e in data.train} == set(MODULES)
    assert {e.module for e in data.extrapolate} == {"add_or_sub_big", "add_sub_multiple_longer"}
    assert len(data.interpolate) == len(data.extrapolate) == 12
    assert not {e.question for e in data.train} & {e.question for e in data.interpolate + data.extrapolate}
    again = dm.generate_split("interpolate", MODULES, 6, seed=0)
    assert again == data.interpolate  # the cache holds what the seed generates
    assert dm.generate_split("interpolate", MODULES, 6, seed=1) != again
    longer = [e.n_operations for e in data.extrapolate if e.module == "add_sub_multiple_longer"]
    shorter = [e.n_operations for e in data.interpolate if e.module == "add_sub_multiple"]
    assert min(longer) > max(shorter) - 3 and sum(longer) > sum(shorter)


@pytest.mark.unit
def test_training_levels_are_selectable(tmp_path):
    easy = dm.load_or_generate(tmp_path, ("add_sub_multiple",), 9, 3, seed=0, train_levels=("train-easy",))
    assert easy.meta["train_levels"] == ["train-easy"] and len(easy.train) == 9
    assert easy.path != dm.load_or_generate(tmp_path, ("add_sub_multiple",), 9, 3, seed=0).path
    with pytest.raises(DataError):
        dm.load_or_generate(tmp_path, ("add_sub_multiple",), 9, 3, train_levels=("train-impossible",))


@pytest.mark.unit
def test_the_small_number_module_answers_its_own_expressions():
    import re

    interp = dm.generate_split("interpolate", ("add_sub_multiple_small",), 90, seed=0)
    extra = dm.generate_split("extrapolate", ("add_sub_multiple_small",), 60, seed=0)
    for e in interp + extra:
        expr = re.sub(r"^(What is the value of|What is|Evaluate|Calculate) ", "", e.question).rstrip("?.")
        assert re.fullmatch(r"[-+() 0-9]+", expr), e.question
        assert eval(expr) == int(e.answer), e  # the generator's expression has the stated value
        assert -49 <= int(e.answer) <= 49
    assert {e.n_operations for e in interp} == {2, 3, 4} and {e.n_operations for e in extra} == {5, 6}
    assert {e.module for e in extra} == {"add_sub_multiple_small_longer"}
    assert len({e.answer for e in interp}) > 40  # spread answers: a constant answer is rarely right
    assert dm.generate_split("interpolate", ("add_sub_multiple_small",), 90, seed=0) == interp  # seeded
    with pytest.raises(DataError, match="cannot be mixed"):
        dm.generate_split("interpolate", ("add_sub_multiple_small", "mul"), 3, seed=0)


@pytest.mark.unit
def test_changed_small_module_settings_change_the_data_and_run_keys(monkeypatch):
    mods = ("add_sub_multiple_small",)
    data_key, run_key = dm.data_key(mods, 10, 5, 0), cfg("transformer", "lm", modules=mods).key()
    plain = (dm.data_key(("add_sub_multiple",), 10, 5, 0), cfg("transformer", "lm", modules=("add_sub_multiple",)).key())
    monkeypatch.setitem(dm.SMALL_MODULES, "add_sub_multiple_small_longer",
                        {**dm.SMALL_MODULES["add_sub_multiple_small_longer"], "entropy": 3.0})
    assert dm.data_key(mods, 10, 5, 0) != data_key  # never served the data of other settings
    assert cfg("transformer", "lm", modules=mods).key() != run_key
    assert (dm.data_key(("add_sub_multiple",), 10, 5, 0),
            cfg("transformer", "lm", modules=("add_sub_multiple",)).key()) == plain  # the release's modules: as before


@pytest.mark.unit
def test_n_operations_on_the_paper_probes():
    assert [dm.n_operations(q) for q, _ in dm.PROBES] == [3, 5, 4, 5]
    assert dm.n_operations("Add 3 and 5.") == 1


@pytest.mark.unit
def test_tokenizer_format_and_masks():
    tok = CharTokenizer()
    ex = dm.MathExample("What is 2 + 3?", "5", "add_or_sub", "train")
    ids, a_start = tok.encode_example(ex.question, ex.answer)
    assert ids[0] == tok.bos_id and ids[-1] == tok.eos_id
    assert tok.decode(ids) == " Q: What is 2 + 3? A: 5"
    assert tok.decode(ids[1:a_start]) == " Q: What is 2 + 3? A:" and tok.decode(ids[a_start:]) == " 5"
    b = collate(tok, [ex, dm.MathExample("1+1", "2", "add_or_sub", "train")])
    assert b.ids.shape == (2, len(ids))
    assert tok.decode(b.ids[0][b.answer_mask[0]].tolist(), skip_special=False) == " 5</s>"
    assert b.pad_mask[1].sum() == len(tok.encode_example("1+1", "2")[0]) and not b.answer_mask[1][~b.pad_mask[1]].any()


# ---- objectives ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("objective", ["lm", "answer_only"])
@pytest.mark.integration
def test_question_tokens_get_no_gradient_under_answer_only(objective):
    tok = CharTokenizer()
    c = cfg("transformer", objective)
    model = build_model(c.model_config(tok.vocab_size))
    b = collate(tok, [dm.MathExample("What is 12 + 30?", "42", "add_or_sub", "train"),
                         dm.MathExample("1-7", "-6", "add_or_sub", "train")])
    grabbed = {}

    def keep(mod, args, out):
        out.retain_grad()
        grabbed["logits"] = out

    h = model.lm_head.register_forward_hook(keep)
    task, _ = tr.lm_loss(model, b, objective)
    h.remove()
    task.backward()
    g = grabbed["logits"].grad[:, :-1].abs().sum(-1)  # [B, T-1]: gradient on the prediction of token t+1
    predicts_answer = b.answer_mask[:, 1:]
    predicts_question = b.pad_mask[:, 1:] & ~predicts_answer
    assert (g[predicts_answer] > 0).all()
    assert (g[~b.pad_mask[:, 1:]] == 0).all()  # padding never
    if objective == "answer_only":
        assert (g[predicts_question] == 0).all()
    else:
        assert (g[predicts_question] > 0).all()


# ---- training: resume, cache, learning ----------------------------------------------------------------------------

@pytest.mark.integration
def test_a_finished_run_keeps_a_resume_checkpoint_that_git_tracks(data_dir, tmp_path):
    """A checkpoint committed to carry a run across sessions belongs to the repository: finishing the run leaves it
    (an untracked one is removed, as in the test below)."""
    import shutil
    import subprocess

    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    c = cfg("transformer", "answer_only", steps=4)
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    assert tr.train_run(c, tmp_path / "ck", data_dir=data_dir, stop_after=2, progress=False) is None
    ckpt = tr.run_dir(c, tmp_path / "ck") / "ckpt.pt"
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "add", "-f", str(ckpt)], cwd=tmp_path,
                   check=True)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "x"], cwd=tmp_path,
                   check=True)
    assert tr.train_run(c, tmp_path / "ck", data_dir=data_dir, progress=False) is not None
    assert ckpt.is_file()


@pytest.mark.integration
def test_resume_reproduces_the_uninterrupted_run(data_dir, tmp_path):
    c = cfg("moeut", "answer_only", steps=6)
    straight = tr.train_run(c, tmp_path / "a", data_dir=data_dir, progress=False)
    assert tr.train_run(c, tmp_path / "b", data_dir=data_dir, stop_after=3, progress=False) is None
    assert (tr.run_dir(c, tmp_path / "b") / "ckpt.pt").exists()
    resumed = tr.train_run(c, tmp_path / "b", data_dir=data_dir, progress=False)
    assert not (resumed.parent / "ckpt.pt").exists()
    a, b = torch.load(straight, weights_only=False), torch.load(resumed, weights_only=False)
    assert a["history"] == b["history"] and len(a["history"]) == 6
    for key, value in a["state_dict"].items():
        assert torch.equal(value, b["state_dict"][key]), key


@pytest.mark.integration
@pytest.mark.parametrize("damage", ["cut", "empty"])
def test_a_damaged_resume_checkpoint_is_named_set_aside_and_the_run_trains_from_step_0(damage, data_dir, tmp_path,
                                                                                       capsys):
    """A cut or empty ``ckpt.pt`` (no torch traceback): one line names it, it is kept aside (hidden, so git ignores
    it), and the run trains from step 0 to the weights of an uninterrupted run; the comparison list says so too."""
    from lmdepth.analyses.scratch import run_state

    c = cfg("transformer", "answer_only", steps=6)
    straight = tr.train_run(c, tmp_path / "a", data_dir=data_dir, progress=False)
    assert tr.train_run(c, tmp_path / "b", data_dir=data_dir, stop_after=3, progress=False) is None
    ckpt = tr.run_dir(c, tmp_path / "b") / "ckpt.pt"
    data = ckpt.read_bytes()
    ckpt.write_bytes(data[: len(data) // 2] if damage == "cut" else b"")
    assert run_state(c, tmp_path / "b")[0].startswith("training (its checkpoint is damaged")
    capsys.readouterr()
    resumed = tr.train_run(c, tmp_path / "b", data_dir=data_dir, progress=False)
    err = capsys.readouterr().err
    assert err.count("is damaged and cannot be read") == 1 and "Traceback" not in err and "from step 0" in err
    kept = list(ckpt.parent.glob(".ckpt.pt.damaged-*"))
    assert len(kept) == 1 and kept[0].read_bytes() == ckpt_bytes(data, damage)
    a, b = torch.load(straight, weights_only=False), torch.load(resumed, weights_only=False)
    assert all(torch.equal(v, b["state_dict"][k]) for k, v in a["state_dict"].items())


def ckpt_bytes(data: bytes, damage: str) -> bytes:
    return data[: len(data) // 2] if damage == "cut" else b""


@pytest.mark.integration
def test_a_cut_finished_model_is_never_listed_or_served_as_finished(data_dir, tmp_path):
    from lmdepth.analyses.scratch import run_state
    from lmdepth.errors import DamagedFile

    c = cfg("transformer", "answer_only", steps=2)
    final = tr.train_run(c, tmp_path, data_dir=data_dir, progress=False)
    final.write_bytes(final.read_bytes()[:1000])
    state, step, path = run_state(c, tmp_path)
    assert state.startswith("damaged") and path is None and step == 0
    with pytest.raises(DamagedFile, match="model.pt is damaged"):
        tr.train_run(c, tmp_path, data_dir=data_dir, progress=False)


@pytest.mark.unit
@pytest.mark.parametrize("argv, says", [(["--device", "tpu"], "device must be"), (["--threads", "-1"], "at least 1")])
def test_lmdepth_train_refuses_a_bad_device_or_thread_count_in_one_line(argv, says, tmp_path):
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "lmdepth.book.cli", "train", "--profile", "smoke", "--checkpoint-dir",
                          str(tmp_path), *argv], capture_output=True, text=True)
    assert out.returncode != 0 and says in out.stderr and "Traceback" not in out.stderr
    assert not any(tmp_path.iterdir())  # before any work


@pytest.mark.integration
def test_the_learning_curve_leaves_the_training_untouched(data_dir, tmp_path):
    plain = torch.load(tr.train_run(cfg("moeut", "lm", steps=6), tmp_path / "a", data_dir=data_dir, progress=False),
                       weights_only=False)
    c = cfg("moeut", "lm", steps=6, eval_every=4, n_curve=5)
    assert c.key() == cfg("moeut", "lm", steps=6).key()  # the same run: the curve is a view of it
    assert tr.train_run(c, tmp_path / "b", data_dir=data_dir, stop_after=3, progress=False) is None  # resumed too
    curved = torch.load(tr.train_run(c, tmp_path / "b", data_dir=data_dir, progress=False), weights_only=False)
    assert [p[0] for p in curved["curve"]] == [4, 6] and plain["curve"] == []
    assert all(0 <= em <= 1 for p in curved["curve"] for em in p[1:])
    assert curved["history"] == plain["history"]
    for key, value in plain["state_dict"].items():
        assert torch.equal(value, curved["state_dict"][key]), key


def poison_steps(monkeypatch, bad: set[int]) -> None:
    """Make the task loss NaN on the given (0-based) steps, as a numerical accident would."""
    calls = []
    real = tr.lm_loss

    def lm_loss(*a, **kw):
        task, aux = real(*a, **kw)
        calls.append(None)
        return (task * float("nan"), aux) if len(calls) - 1 in bad else (task, aux)

    monkeypatch.setattr(tr, "lm_loss", lm_loss)


@pytest.mark.integration
def test_a_non_finite_update_is_skipped_and_recorded_not_applied(data_dir, tmp_path, monkeypatch):
    poison_steps(monkeypatch, {2})
    trained = torch.load(tr.train_run(cfg("moeut", "answer_only", steps=6), tmp_path, data_dir=data_dir,
                                      progress=False), weights_only=False)
    assert trained["meta"]["skipped_updates"] == [2]
    assert [v != v for _, v in trained["history"]] == [False, False, True, False, False, False]  # NaN at step 3
    assert all(torch.isfinite(v).all() for v in trained["state_dict"].values())  # without the guard: all NaN


@pytest.mark.integration
def test_a_run_that_keeps_diverging_stops_with_its_last_checkpoint_intact(data_dir, tmp_path, monkeypatch):
    from lmdepth.errors import TrainingDiverged

    monkeypatch.setattr(tr, "MAX_CONSECUTIVE_SKIPS", 3)
    poison_steps(monkeypatch, set(range(2, 100)))
    c = cfg("transformer", "lm", steps=8, ckpt_every=2)
    with pytest.raises(TrainingDiverged, match="3 non-finite gradients in a row up to step 4.*Lower the learning"):
        tr.train_run(c, tmp_path, data_dir=data_dir, progress=False)
    state = torch.load(tr.run_dir(c, tmp_path) / "ckpt.pt", weights_only=False)
    assert state["step"] == 4 and state["skipped_updates"] == [2, 3]  # saved at step 4, before the third skip
    assert all(torch.isfinite(v).all() for v in state["model"].values())


@pytest.mark.integration
def test_finished_run_is_a_cached_noop(data_dir, tmp_path):
    c = cfg("transformer", "lm", steps=2)
    path = tr.train_run(c, tmp_path, data_dir=data_dir, progress=False)
    stamp = path.stat().st_mtime_ns
    assert tr.train_run(c, tmp_path, data_dir=data_dir, progress=False) == path
    assert path.stat().st_mtime_ns == stamp
    assert json.loads((path.parent / "meta.json").read_text())["train_config"]["steps"] == 2
    assert tr.run_dir(c, tmp_path) != tr.run_dir(cfg("transformer", "answer_only", steps=2), tmp_path)
    model, tok, meta = tr.load_trained(path)
    assert not model.training and meta["n_parameters"] > 0 and len(meta["history"]) == 2


@pytest.mark.parametrize("arch", ["moeut", "transformer"])
@pytest.mark.integration
def test_a_few_steps_reduce_the_loss(arch):
    torch.manual_seed(0)
    tok = CharTokenizer()
    c = cfg(arch, "lm", lr=1e-2, warmup=1, steps=15)
    model = build_model(c.model_config(tok.vocab_size)).train()
    opt = torch.optim.AdamW(model.parameters(), lr=c.lr)
    b = collate(tok, [dm.MathExample(f"What is {i} + {2 * i}?", str(3 * i), "add_or_sub", "train") for i in range(4)])
    losses = []
    for _ in range(15):
        task, aux = tr.lm_loss(model, b, "lm")
        opt.zero_grad()
        (task + aux).backward()
        opt.step()
        losses.append(task.item())
    assert sum(losses[-3:]) / 3 < 0.6 * sum(losses[:3]) / 3


@pytest.mark.unit
def test_a_preset_can_set_training_fields_per_architecture(monkeypatch):
    preset = {**tr.PRESETS["smoke"], "train_moeut": {"lr": 1e-4}}
    monkeypatch.setitem(tr.PRESETS, "smoke", preset)
    assert tr.run_config("smoke", "moeut", "lm").lr == 1e-4
    assert tr.run_config("smoke", "transformer", "lm").lr == preset["train"]["lr"]
    assert tr.run_config("smoke", "moeut", "lm", lr=5e-4).lr == 5e-4  # an explicit override still wins
    assert tr.run_config("smoke", "moeut", "lm").key() != tr.run_config("smoke", "moeut", "lm", lr=3e-3).key()


@pytest.mark.unit
def test_batches_and_schedule_are_pure_functions_of_the_step():
    assert torch.equal(tr.batch_indices(7, 50, 8, 0), tr.batch_indices(7, 50, 8, 0))
    seen = torch.cat([tr.batch_indices(s, 48, 8, 0) for s in range(6)])
    assert sorted(seen.tolist()) == list(range(48))  # one epoch visits every example once
    c = cfg(steps=100, warmup=10, lr=1.0, min_lr_ratio=0.1)
    assert tr.lr_at(0, c) == pytest.approx(0.1) and tr.lr_at(9, c) == pytest.approx(1.0)
    assert tr.lr_at(100, c) == pytest.approx(0.1)


# ---- evaluation -------------------------------------------------------------------------------------------------

class Oracle(torch.nn.Module):
    """Predicts the true next token of fixed sequences (to test the metric, not a model)."""

    def __init__(self, target: torch.Tensor, vocab: int):
        super().__init__()
        self.target, self.vocab = target, vocab

    def forward(self, ids, **_):
        nxt = torch.roll(self.target[: ids.shape[0], : ids.shape[1]], -1, dims=1)
        return SimpleNamespace(logits=torch.nn.functional.one_hot(nxt, self.vocab).float())


@pytest.mark.unit
def test_exact_match_counts_answer_tokens_and_eos_only():
    tok = CharTokenizer()
    exs = [dm.MathExample("What is 2 + 3?", "5", "add_or_sub", "interpolate")]
    ids = collate(tok, exs).ids
    assert ev.exact_match(Oracle(ids, tok.vocab_size), tok, exs).all()
    wrong_question = ids.clone()
    wrong_question[0, 5] = tok.stoi["x"]  # the oracle "mispredicts" a question token: still exact
    assert ev.exact_match(Oracle(wrong_question, tok.vocab_size), tok, exs).all()
    for pos in (-3, -2, -1):  # the space, the digit, the EOS
        wrong = ids.clone()
        wrong[0, pos] = tok.stoi["7"] if pos != -2 else tok.stoi["6"]
        assert not ev.exact_match(Oracle(wrong, tok.vocab_size), tok, exs).any()


@pytest.mark.integration
def test_evaluate_and_greedy_answer_on_a_tiny_model(data_dir):
    tok = CharTokenizer()
    c = cfg("moeut")
    model = build_model(c.model_config(tok.vocab_size)).eval()
    data = tr.load_data(c, data_dir)
    df = ev.evaluate(model, tok, data.interpolate + data.extrapolate)
    acc = ev.accuracy_table(df)
    assert set(acc["split"]) == {"interpolate", "extrapolate"} and "all" in set(acc["module"])
    assert df["n_operations"].notna().all()
    ans = ev.greedy_answer(model, tok, dm.PROBES[0][0], max_new_tokens=5)
    assert isinstance(ans, str) and len(ans) <= 5


@pytest.mark.unit
def test_the_fine_tuning_script_refuses_a_seed_outside_its_queue():
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "scripts/finetune_runs.py", "--only", "7", "--list"], cwd=root,
                         capture_output=True, text=True)
    assert out.returncode == 2 and "--only names seeds of the queue" in out.stderr and "[7]" in out.stderr

"""Resuming with every resumable setting changed keeps the optimizer's step and state (or is
refused with one line); a refused resume leaves the run's folder as it was, byte for byte; and the
failures met when every setting was first tried end to end, each as it was met.

Made from hyperparams.RESUMABLE_FIELDS: a setting marked resumable joins the matrix by itself."""
import dataclasses
import hashlib
import json
import os
import shutil

import numpy as np
import pytest

import hyperparams
from conftest import assert_one_line_error, run_script
from test_settings import REFUSED as TRAINING_REFUSED
from test_settings import SENTENCE, TINY, fields, option, train


# Settings a run cannot resume into (a line of the one-line error each gives): those training
# refuses, and float16, whose optimizer state holds a loss scale that the run's (auto: float32 or
# mixed bfloat16) does not.
REFUSED = {**TRAINING_REFUSED,
           ("precision", "mixed_float16"): r"trained in (float32|mixed_bfloat16), which cannot go on in "
                                           r"mixed_float16: .* resume with --precision (float32|mixed_bfloat16)"}


def resume_cases():
    """(field, value) for every resumable field: each other value of a choice, the other side of a
    switch, another number; the folders are handled in their own tests."""
    cases = []
    for name in hyperparams.RESUMABLE_FIELDS:
        f = fields()[name]
        default = f.default
        if name in ("logdir", "prepro_dir", "data_dir", "compile_cache"):
            continue
        if name == "num_epochs":
            continue  # every resume below raises it
        if f.metadata["choices"]:
            cases += [(name, value) for value in f.metadata["choices"] if value != default]
        elif isinstance(default, bool):
            cases.append((name, not default))
        elif isinstance(default, int):
            cases.append((name, default + 1))
        else:
            cases.append((name, default / 2 if default else 0.01))
    return cases


def folder_bytes(folder):
    """{relative path: sha256} of every file under folder."""
    out = {}
    for root, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, folder)] = hashlib.sha256(f.read()).hexdigest()
    return out


def optimizer_arrays(path):
    """The optimizer's saved variables of a checkpoint, in order."""
    from test_train import saved_arrays

    arrays = saved_arrays(path)
    count = len([k for k in arrays if k.startswith("optimizer/vars/")])
    return [arrays[f"optimizer/vars/{i}"] for i in range(count)]


@pytest.fixture(scope="module")
def one_epoch(corpus):
    """A run of one epoch."""
    logdir = corpus / "one_epoch"
    done = train(corpus, logdir)
    assert done.returncode == 0, done.stderr[-3000:]
    return logdir


@pytest.mark.slow
@pytest.mark.parametrize("name,value", resume_cases(), ids=lambda v: str(v))
def test_each_resumable_setting_keeps_the_optimizers_step_and_state(corpus, one_epoch, tmp_path, name, value):
    from trained import checkpoints

    logdir = tmp_path / "log"
    shutil.copytree(one_epoch, logdir)
    (path, state), = [(p, checkpoints.read_state(p)) for _, p in checkpoints.epoch_checkpoints(logdir)]
    saved = json.loads((logdir / "hparams.json").read_text())
    # the state carried: restore it as train.py will, with the setting changed, and compare
    hp = dataclasses.replace(hyperparams.load_hparams(str(logdir)), **{name: value})
    if (name, value) not in REFUSED:
        import keras

        from support import devices

        keras.mixed_precision.set_global_policy(devices.precision(hp))  # as devices.setup sets it
        try:
            restored = checkpoints.restore(path, state, hp)
        finally:
            keras.mixed_precision.set_global_policy("float32")
        got = [np.asarray(v) for v in restored.optimizer.variables
               if v is not getattr(restored.optimizer, "skipped_steps", None)]
        want = optimizer_arrays(path)
        assert len(got) == len(want) and all(np.array_equal(g, w) for g, w in zip(got, want)), name
    # and the run resumed with it: the step goes on from the checkpoint's
    before = folder_bytes(logdir)
    resumed = train(corpus, logdir, "--num_epochs", "2", *option(name, value))
    if (name, value) in REFUSED:
        assert_one_line_error(resumed, REFUSED[name, value])
        assert folder_bytes(logdir) == before
        return
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming from {path}: epoch 1 done, step {state['step']}" in resumed.stdout
    record = json.loads((logdir / "hparams.json").read_text())
    assert record["changes"][-1] == {"step": state["step"], name: [saved[name], value], "num_epochs": [1, 2]}
    epochs = [json.loads(line) for line in (logdir / "history.jsonl").read_text().splitlines()]
    assert epochs[-1]["epoch"] == 2 and epochs[-1]["step"] > state["step"]


@pytest.mark.slow
def test_a_moved_run_and_a_copied_prepro_folder_resume(corpus, one_epoch, tmp_path):
    moved, prepro = tmp_path / "moved", tmp_path / "prepro_copy"
    shutil.copytree(one_epoch, moved)
    shutil.copytree(corpus / "prepro", prepro)
    resumed = run_script("train.py", "--prepro_dir", prepro, "--logdir", moved, *TINY, "--num_epochs", "2")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "epoch 1 done, step" in resumed.stdout and "epoch 2:" in resumed.stdout


REFUSALS = {  # a resume refused, with the words of its error
    "a model setting": (["--d_model", "32"], r"trained with other settings \(d_model 16 -> 32\)"),
    "another vocabulary": (["--prepro_dir", "{other}"], r"no longer holds the data this run started on "
                                                         r"\(bpe_sha256"),
    "a linear decay's length": (["--num_epochs", "3"], r"--num_epochs 3: this run's learning rate falls linearly"),
}


@pytest.fixture(scope="module")
def other_vocabulary(corpus):
    other = corpus / "other_prepro"
    done = run_script("prepro.py", "--data_dir", corpus / "raw", "--prepro_dir", other, "--vocab_size", "90")
    assert done.returncode == 0, done.stderr[-2000:]
    return other


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_a_refused_resume_leaves_the_run_folder_byte_for_byte(corpus, other_vocabulary, tmp_path, case):
    logdir = tmp_path / "log"
    done = train(corpus, logdir, "--lr_decay", "linear")
    assert done.returncode == 0, done.stderr[-3000:]
    before = folder_bytes(logdir)
    given, words = REFUSALS[case]
    refused = train(corpus, logdir, *[a.format(other=other_vocabulary) for a in given], "--lr_decay", "linear")
    assert_one_line_error(refused, words)
    assert folder_bytes(logdir) == before
    # a script that decodes the run checks a --prepro_dir it is given, eval.py the run's own too
    if case == "another vocabulary":
        for script, extra in (("eval.py", []), ("translate.py", ["--input", corpus / "raw" / "test.de"]),
                              ("attention.py", ["--output", tmp_path / "a.png", SENTENCE])):
            run = run_script(script, "--logdir", logdir, "--prepro_dir", other_vocabulary, *extra)
            assert_one_line_error(run, r"holds another vocabulary than the run in .*: pass the --prepro_dir the "
                                       r"run was trained on")
        assert folder_bytes(logdir) == before


# The four failures of the issue that asked for these matrices, each as it was met

@pytest.mark.slow
def test_a_linear_decay_run_of_the_sample_preset_is_evaluated(tmp_path):
    prepro = tmp_path / "prepro"
    assert run_script("prepro.py", "--prepro_dir", prepro).returncode == 0
    logdir = tmp_path / "log"
    done = run_script("train.py", "--preset", "sample", "--prepro_dir", prepro, "--logdir", logdir,
                      "--num_epochs", "1", "--lr_decay", "linear")
    assert done.returncode == 0, done.stderr[-3000:]
    for beam in ("1", "2"):
        scored = run_script("eval.py", "--logdir", logdir, "--beam_size", beam)
        assert scored.returncode == 0, scored.stderr[-3000:]
        assert "loss test" in scored.stdout and "BLEU test sacreBLEU" in scored.stdout
    kept = os.listdir(logdir / "results")  # per evaluation: the translations two ways, and the record
    assert len(kept) == 6 and sum(name.endswith(".json") for name in kept) == 2, kept


@pytest.mark.slow
@pytest.mark.parametrize("multiple", ["1", "8", "16"])
def test_learned_positions_train_where_lengths_reach_maxlen(corpus, tmp_path, multiple):
    """maxlen1 30 and maxlen2 28 keep pairs of those lengths (dev's too); padded to a multiple of 8
    or 16 they would need positions past the table's last row (the dev loss, training steps)."""
    logdir = tmp_path / "log"
    done = train(corpus, logdir, "--positional", "learned", "--maxlen1", "30", "--maxlen2", "28",
                 "--length_multiple", multiple, "--eval_sentences", "3")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "dev loss nan" not in done.stdout
    for beam in ("1", "3"):
        scored = run_script("eval.py", "--logdir", logdir, "--beam_size", beam)
        assert scored.returncode == 0, scored.stderr[-3000:]


@pytest.mark.slow
def test_skip_nonfinite_changed_on_resume_keeps_the_optimizer_both_ways(corpus, tmp_path):
    from trained import checkpoints

    logdir = tmp_path / "log"
    assert train(corpus, logdir, "--skip_nonfinite", "1").returncode == 0
    steps = []
    for epochs, skip in (("2", "0"), ("3", "1")):
        (_, path), = checkpoints.epoch_checkpoints(logdir)[-1:]
        step = checkpoints.read_state(path)["step"]
        resumed = train(corpus, logdir, "--num_epochs", epochs, "--skip_nonfinite", skip)
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        assert f"done, step {step}" in resumed.stdout and "Skipping variable loading" not in resumed.stderr
        steps.append(step)
    assert 0 < steps[0] < steps[1]


@pytest.mark.slow
def test_a_subword_sampling_run_repeats_and_resumes_exactly(corpus, tmp_path):
    """Each epoch's segmentation depends only on (seed, epoch), in any process: two runs with the
    same seed, and a run stopped after its first epoch and resumed, end bit for bit alike."""
    from test_train import assert_same_run

    runs = {name: tmp_path / name for name in ("straight", "again", "resumed")}
    sampled = ["--subword_sampling", "0.3", "--num_epochs", "2"]
    for name in ("straight", "again"):
        assert train(corpus, runs[name], *sampled).returncode == 0
    assert train(corpus, runs["resumed"], *sampled[:2]).returncode == 0  # one epoch, then a new process
    resumed = train(corpus, runs["resumed"], *sampled)
    assert resumed.returncode == 0 and "epoch 1 done" in resumed.stdout, resumed.stderr[-3000:]
    assert_same_run(runs["again"], runs["straight"])
    assert_same_run(runs["resumed"], runs["straight"])

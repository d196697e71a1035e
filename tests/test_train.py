"""Training survives faults: SIGKILL and SIGTERM mid-epoch, a fixed seed gives the same run, and a
non-finite loss stops training without touching the last good checkpoint."""
import glob
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import ROOT, assert_one_line_error, run_script

# 24 steps per epoch on corpora/sample (lengths padded exactly), a mid-epoch checkpoint every 5; a
# model of one block a side: what these tests check does not depend on its size, and building and
# tracing it is most of each run's time
SETTINGS = ["--num_epochs", "2", "--save_every_steps", "5", "--eval_sentences", "5", "--tokens_per_batch", "256",
            "--d_model", "32", "--d_ff", "64", "--num_blocks", "1", "--num_heads", "2"]


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    """The sample corpus prepared once, and an uninterrupted 2-epoch run on it."""
    tmp = tmp_path_factory.mktemp("train")
    prepro_dir = str(tmp / "prepro")
    done = run_script("prepro.py", "--prepro_dir", prepro_dir)
    assert done.returncode == 0, done.stderr[-2000:]
    run = train(prepro_dir, tmp / "baseline")
    assert run.returncode == 0, run.stderr[-3000:]
    return prepro_dir, tmp / "baseline"


def train(prepro_dir, logdir, *extra):
    return run_script("train.py", "--prepro_dir", prepro_dir, "--logdir", str(logdir), *SETTINGS, *extra)


def history(logdir):
    return [json.loads(line) for line in open(os.path.join(logdir, "history.jsonl"))]


def saved_arrays(path):
    """Every array a checkpoint holds, by name: the weights and the optimizer's state (step count,
    first and second moments), read straight from the .keras zip."""
    import io
    import zipfile

    import h5py

    with zipfile.ZipFile(path) as z:
        data = z.read("model.weights.h5")
    out = {}
    with h5py.File(io.BytesIO(data), "r") as f:
        f.visititems(lambda name, item: out.__setitem__(name, item[()]) if isinstance(item, h5py.Dataset) else None)
    return out


def assert_same_run(logdir, reference):
    """Bit for bit: every epoch's training loss, the checkpoint names (which carry that loss), and
    every weight and optimizer variable of the last checkpoint."""
    assert [h["train_loss"] for h in history(logdir)] == [h["train_loss"] for h in history(reference)]
    names = lambda d: sorted(n for n in os.listdir(os.path.join(d, "ckpt")) if n.endswith(".keras"))
    assert names(logdir) == names(reference)
    got, want = (saved_arrays(os.path.join(d, "ckpt", names(reference)[-1])) for d in (logdir, reference))
    assert sorted(got) == sorted(want) and any(name.startswith("optimizer/") for name in want)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def start_and_wait_for_step_checkpoint(prepro_dir, logdir):
    """Start training in the background; return it once its first mid-epoch checkpoint exists."""
    process = subprocess.Popen([sys.executable, "train.py", "--prepro_dir", prepro_dir, "--logdir", str(logdir),
                                *SETTINGS], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while not glob.glob(os.path.join(logdir, "ckpt", "steps", "S*.keras")):
        assert process.poll() is None, process.communicate()[1][-3000:]
        assert time.time() < deadline, "no mid-epoch checkpoint after 300 s"
        time.sleep(0.01)
    return process


@pytest.mark.slow
def test_same_seed_gives_the_same_run(baseline, tmp_path):
    prepro_dir, reference = baseline
    again = train(prepro_dir, tmp_path / "again")
    assert again.returncode == 0, again.stderr[-3000:]
    assert_same_run(tmp_path / "again", reference)  # bit for bit on the CPU


@pytest.mark.slow
def test_sigkill_mid_epoch_then_resume_finishes_as_if_never_stopped(baseline, tmp_path):
    """Killed right after the checkpoint of step 30 (epoch 2, batch 6 of 24: the epoch's loss so far
    travels in that checkpoint), then resumed: the same run, bit for bit."""
    prepro_dir, reference = baseline
    logdir = tmp_path / "killed"
    killed = run_script("tests/interrupted_train.py", "30", "train.py", "--prepro_dir", prepro_dir, "--logdir",
                        str(logdir), *SETTINGS)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    newest = os.path.join(logdir, "ckpt", "steps", "S00000030.keras")
    assert os.path.isfile(newest) and not glob.glob(os.path.join(logdir, "ckpt", "E02*"))
    resumed = train(prepro_dir, logdir)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming from {newest}: epoch 2, batch 6 of 24, step 30\n" in resumed.stdout, resumed.stdout[:3000]
    assert_same_run(logdir, reference)
    assert not glob.glob(os.path.join(logdir, "ckpt", "steps", "*.keras"))  # superseded by epoch checkpoints


@pytest.mark.slow
def test_sigterm_saves_a_checkpoint_and_exits(baseline, tmp_path):
    prepro_dir, reference = baseline
    logdir = tmp_path / "terminated"
    process = start_and_wait_for_step_checkpoint(prepro_dir, logdir)
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 128 + signal.SIGTERM, err[-3000:]
    saved = re.search(r"stopped by SIGTERM in epoch 1 at batch (\d+) of 24: saved (\S+S(\d+)\.keras)", out)
    assert saved and saved.group(1) == str(int(saved.group(3))), out[-2000:]
    assert os.path.isfile(saved.group(2))
    assert len(os.listdir(logdir / "ckpt" / "steps")) <= 2  # keep_step_checkpoints
    resumed = train(prepro_dir, logdir)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming from {saved.group(2)}: epoch 1, batch {saved.group(1)} of 24" in resumed.stdout
    assert_same_run(logdir, reference)


@pytest.mark.slow
def test_nonfinite_loss_stops_and_leaves_the_last_checkpoint_untouched(baseline, tmp_path):
    prepro_dir, reference = baseline
    logdir = tmp_path / "diverged"
    shutil.copytree(reference, logdir)
    last, = glob.glob(os.path.join(logdir, "ckpt", "E02*.keras"))
    digest = hashlib.sha256(open(last, "rb").read()).hexdigest()
    before = sorted(os.listdir(logdir / "ckpt"))
    run = train(prepro_dir, logdir, "--num_epochs", "3", "--lr", "1e30", "--warmup_steps", "0")
    assert run.returncode == 2 and "Traceback" not in run.stderr
    error = run.stderr.strip().splitlines()[-1]
    assert re.search(rf"training loss became nan at step \d+ \(epoch 3, batch \d+\); the last good checkpoint, "
                     rf"{re.escape(last)}, is untouched", error), error
    assert hashlib.sha256(open(last, "rb").read()).hexdigest() == digest
    assert sorted(os.listdir(logdir / "ckpt")) == before


# The quick start's run (conftest.quick_start): end to end, resuming, and a broken TF_CONFIG

def tensorboard_tags(folder):
    import tensorflow as tf

    tags = set()
    for name in os.listdir(folder):
        for record in tf.data.TFRecordDataset(os.path.join(folder, name)):
            tags |= {v.tag for v in tf.compat.v1.Event.FromString(record.numpy()).summary.value}
    return tags


def test_quick_start_end_to_end(quick_start):
    prepro, train, evaluation = quick_start.runs
    for run in (prepro, train, evaluation):
        assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    assert "split train: 500 pairs" in prepro.stdout
    history = [json.loads(line) for line in open(quick_start.log / "history.jsonl")]
    assert [h["epoch"] for h in history] == list(range(1, 31))
    assert history[-1]["train_loss"] < history[0]["train_loss"] - 2
    assert history[-1]["dev_bleu"] > 20  # the sample is learnable: a broken model stays near 0
    ckpts = os.listdir(quick_start.log / "ckpt")
    assert len(ckpts) == 5 and all(re.fullmatch(r"E\d\dL\d+\.\d\dB\d+\.\d\d\.keras", c) for c in ckpts)
    # B is the dev BLEU the reference's way (multi-bleu.perl), as in its iwslt2016_E19L2.64B28.06
    for h in history[-5:]:
        name = f"E{h['epoch']:02d}L{h['train_loss']:.2f}B{h['dev_bleu_reference']:.2f}"
        assert name + ".keras" in ckpts
        lines = open(quick_start.log / "eval" / name, encoding="utf-8").read().splitlines()
        assert len(lines) == 51 and re.fullmatch(rf"BLEU = {h['dev_bleu_reference']:.2f}, [\d./]+ "
                                                 r"\(BP=[\d.]+, ration=[\d.]+\)", lines[-1])
    assert history[-1]["dev_bleu_reference"] != pytest.approx(history[-1]["dev_bleu"], abs=0.01)
    specs = open(quick_start.log / "specs", encoding="utf-8").read().splitlines()
    assert specs[0].startswith("num_params: ") and any("embeddings===(400, 64)" in line for line in specs)
    tags = tensorboard_tags(quick_start.log / "tensorboard")
    assert {"step/loss", "step/lr", "dev_bleu", "dev_bleu_reference", "dev/0", "dev/2"} <= tags
    last = evaluation.stdout.strip().splitlines()[-2:]
    assert last[0].startswith("BLEU test sacreBLEU = ") and "tok:13a" in last[0]
    assert last[1].startswith("BLEU test reference's way (multi-bleu, whitespace tokens) = ")
    written = re.search(r"wrote \d+ translations to (\S+)", evaluation.stdout).group(1)  # other tests add more
    text = open(quick_start.root / written, encoding="utf-8").read()
    assert text.count("- source: ") == text.count("- got: ") == 50
    assert text.rstrip().splitlines()[-2:] == last  # the scores end the results file


@pytest.mark.slow
def test_training_resumes_from_the_newest_checkpoint(quick_start, tmp_path):
    import shutil
    log = tmp_path / "log"  # a copy: the other tests keep the quick start's 30 epochs
    shutil.copytree(quick_start.log, log)
    dirs = ["--prepro_dir", str(quick_start.prepro), "--logdir", str(log)]
    step = json.loads(open(log / "history.jsonl").readlines()[-1])["step"]
    again = run_script("train.py", "--preset", "sample", *dirs, "--num_epochs", "31")
    assert again.returncode == 0, again.stderr[-3000:]
    assert re.search(rf"resuming from .*E30L.*\.keras: epoch 30 done, step {step}\b", again.stdout)
    last = json.loads(open(log / "history.jsonl").readlines()[-1])
    assert last["epoch"] == 31 and last["step"] > step
    done = run_script("train.py", "--preset", "sample", *dirs, "--num_epochs", "31")
    assert done.returncode == 0 and "nothing to do" in done.stdout


def test_a_broken_tf_config_is_a_one_line_error(tmp_path):
    import subprocess
    import sys

    from conftest import ROOT
    env = dict(os.environ, TF_CONFIG='{"cluster": {"worker": ["127.0.0.1:1"]}, "task": ')
    run = subprocess.run([sys.executable, "train.py", "--logdir", str(tmp_path / "log"), "--prepro_dir",
                          str(tmp_path / "none")], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert_one_line_error(run, r"TF_CONFIG is not a valid cluster description \(.*line 1 column \d+")


def test_training_refuses_prepro_settings_and_hides_them_from_help(tmp_path):
    """--vocab_size, --data_dir, --corpus and the --*_prefix options are prepro.py's: training reads
    the prepro folder's vocabulary and ids, so it refuses them in one line instead of recording a
    value it never used; its --help does not list them."""
    run = run_script("train.py", "--vocab_size", "8000", "--data_dir", "my_corpus", "--logdir", str(tmp_path / "log"))
    assert_one_line_error(run, r"--data_dir, --vocab_size: not read by train.py; they are prepro.py's: "
                               r"training reads .*--prepro_dir")
    assert not (tmp_path / "log").exists()
    shown = run_script("train.py", "--help").stdout
    assert "--prepro_dir" in shown and "--d_model" in shown
    assert "--vocab_size" not in shown and "--data_dir" not in shown

"""The log directory as a self-contained, safe artefact: it carries its vocabulary, one run holds it
at a time, a resume keeps the run's settings and data, file-system errors are one line, and
translate.py follows its input (on copies of the quick start's model)."""
import errno
import json
import os
import select
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT, assert_one_line_error, run_script


@pytest.fixture
def copied(quick_start, tmp_path):
    """A copy of the quick start's log directory (its hparams.json still names the original prepro
    folder), and the original prepro folder."""
    shutil.copytree(quick_start.log, tmp_path / "log")
    return tmp_path / "log", quick_start.prepro


def translate(logdir, *args, text="Ein Mann fährt Fahrrad.\nDie Frau trinkt Kaffee.\n"):
    return subprocess.run([sys.executable, "translate.py", "--logdir", str(logdir), *args], input=text,
                          cwd=ROOT, capture_output=True, text=True, timeout=300)


def other_corpus(folder):
    """The sample corpus with every line's words reversed: other text, another vocabulary."""
    os.makedirs(folder)
    for name in os.listdir(os.path.join(ROOT, "corpora", "sample")):
        with open(os.path.join(ROOT, "corpora", "sample", name), encoding="utf-8") as f:
            lines = [" ".join(reversed(line.split())) for line in f]
        with open(os.path.join(folder, name), "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
    return folder


@pytest.mark.slow
def test_a_copied_log_directory_translates_without_prepro_and_ignores_a_new_vocabulary(copied, tmp_path):
    logdir, prepro = copied
    before = translate(logdir)
    assert before.returncode == 0 and len(before.stdout.splitlines()) == 2, before.stderr[-2000:]
    assert os.path.isfile(logdir / "vocab" / "bpe.model")
    # no prepro folder at all: the run's own vocabulary
    alone = translate(logdir, "--prepro_dir", str(tmp_path / "nowhere"))
    assert alone.returncode == 0 and alone.stdout == before.stdout, alone.stderr[-2000:]
    # prepro.py rebuilt on another corpus with a smaller vocabulary (the swap that gave nonsense and
    # an IndexError, then a loss over ids of another vocabulary): given to a script that decodes the
    # run, it is refused, naming the vocabulary; the run's own prepro folder rebuilt so is ignored
    # by translate.py, which reads none
    swapped = tmp_path / "p2"
    made = run_script("prepro.py", "--data_dir", other_corpus(tmp_path / "other"), "--prepro_dir", str(swapped),
                      "--vocab_size", "300")
    assert made.returncode == 0, made.stderr[-2000:]
    for run in (translate(logdir, "--prepro_dir", str(swapped)),
                run_script("eval.py", "--logdir", str(logdir), "--prepro_dir", str(swapped), "--split", "dev")):
        assert_one_line_error(run, rf"{swapped} holds another vocabulary than the run in {logdir}")
    saved = json.loads((logdir / "hparams.json").read_text())
    (logdir / "hparams.json").write_text(json.dumps({**saved, "prepro_dir": str(swapped)}))
    after = translate(logdir)
    assert after.returncode == 0 and after.stdout == before.stdout, after.stderr[-2000:]
    (logdir / "hparams.json").write_text(json.dumps(saved))
    # resuming on it is refused, naming what changed
    resumed = run_script("train.py", "--logdir", str(logdir), "--prepro_dir", str(swapped), "--num_epochs", "31")
    assert_one_line_error(resumed, rf"{swapped} no longer holds the data this run started on \(bpe_sha256, "
                                   r"vocab_size, data_dir differ")
    # a missing sentencepiece model is one line too
    os.remove(logdir / "vocab" / "bpe.model")
    missing = translate(logdir)
    assert_one_line_error(missing, r"bpe.model: the sentencepiece model is missing")


def test_prepro_refuses_to_replace_a_folder_of_other_data_without_overwrite(copied, tmp_path):
    _, prepro = copied
    folder = tmp_path / "p"
    shutil.copytree(prepro, folder)
    other = str(other_corpus(tmp_path / "other"))
    refused = run_script("prepro.py", "--data_dir", other, "--prepro_dir", str(folder), "--vocab_size", "400")
    assert_one_line_error(refused, rf"{folder} holds a folder made from other data \(data_dir .* -> {other}\); "
                                   r"pass --overwrite")
    assert json.load(open(folder / "meta.json"))["data_dir"] != other  # untouched
    checksum = json.load(open(folder / "meta.json"))["bpe_sha256"]
    again = run_script("prepro.py", "--prepro_dir", str(folder))  # the same data: rebuilt
    assert again.returncode == 0, again.stderr[-2000:]
    # byte for byte the same vocabulary, so the runs trained on it resume on the rebuilt folder
    assert json.load(open(folder / "meta.json"))["bpe_sha256"] == checksum
    replaced = run_script("prepro.py", "--data_dir", other, "--prepro_dir", str(folder), "--vocab_size", "400",
                          "--overwrite")
    assert replaced.returncode == 0 and json.load(open(folder / "meta.json"))["data_dir"] == other


def test_one_training_run_per_log_directory_and_sigkill_leaves_no_stale_lock(tmp_path):
    from support.utils import lock_directory

    held = lock_directory(str(tmp_path / "log"))
    second = run_script("train.py", "--logdir", str(tmp_path / "log"), "--prepro_dir", str(tmp_path / "p"))
    assert_one_line_error(second, rf"{tmp_path / 'log'} is in use by another training run "
                                  rf"\(process {os.getpid()}\)")
    held.close()
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from support import utils; "
                               "utils.lock_directory(sys.argv[1]); print('locked', flush=True); time.sleep(600)",
                               str(tmp_path / "log")],
                              cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"
    holder.kill()
    holder.wait()
    lock_directory(str(tmp_path / "log")).close()  # the kernel released it


@pytest.mark.slow
def test_resuming_keeps_the_runs_settings_and_records_allowed_changes(copied, quick_start):
    logdir, _ = copied
    saved = (logdir / "hparams.json").read_bytes()
    # the prepro folder as the run saved it (relative to the checkout the quick start ran in)
    dirs = ("--logdir", str(logdir), "--prepro_dir", json.loads(saved)["prepro_dir"])

    def run_script(*args):
        return subprocess.run([sys.executable, os.path.join(ROOT, args[0]), *args[1:]], cwd=quick_start.root,
                              capture_output=True, text=True, timeout=600)
    changed = run_script("train.py", *dirs, "--seed", "7", "--lr", "0.01", "--dropout_rate", "0.3")
    assert_one_line_error(changed, r"trained with other settings \(dropout_rate 0.1 -> 0.3, seed 1234 -> 7\); "
                                   r"a resumed run keeps them")
    epochs = json.load(open(logdir / "hparams.json"))["num_epochs"]  # 30, or more after other tests resumed it
    earlier = json.load(open(logdir / "hparams.json")).get("changes", [])
    nothing = run_script("train.py", *dirs, "--num_epochs", str(epochs))
    assert nothing.returncode == 0 and "nothing to do" in nothing.stdout, nothing.stderr[-2000:]
    assert (logdir / "hparams.json").read_bytes() == saved  # not rewritten
    more = run_script("train.py", *dirs, "--num_epochs", str(epochs + 1), "--lr", "0.0005")
    assert more.returncode == 0, more.stderr[-2000:]
    step = json.loads((logdir / "history.jsonl").read_text().splitlines()[-2])["step"]
    assert (f"resuming with changed settings from step {step}: lr 0.001 -> 0.0005, num_epochs {epochs} -> "
            f"{epochs + 1}") in more.stdout
    record = json.load(open(logdir / "hparams.json"))
    assert record["num_epochs"] == epochs + 1 and record["lr"] == 0.0005
    assert record["changes"] == earlier + [{"step": step, "lr": [0.001, 0.0005], "num_epochs": [epochs, epochs + 1]}]


def test_a_resume_the_presets_new_values_refuse_gives_the_options_that_resume_it(tmp_path):
    """A run trained before its preset changed: the refusal names the preset's values (not given on
    the command line) with the options that resume the run as it was, and a setting given on the
    command line with the option to drop."""
    import hyperparams
    import train
    from support.utils import UserError

    hyperparams.save_hparams(hyperparams.preset("sample", dropout_rate=0.3, logdir=str(tmp_path)), str(tmp_path))
    hp = hyperparams.preset("sample", seed=7, logdir=str(tmp_path))  # the preset's dropout, seed 7 given
    with pytest.raises(UserError) as refused:
        train.resume_changes(hp, given={"seed": 7})
    message = str(refused.value)
    assert f"(dropout_rate 0.3 -> {hp.dropout_rate}, seed 1234 -> 7)" in message
    assert "drop --seed and give --dropout_rate 0.3 (the --preset's own values differ" in message
    resumed = hyperparams.preset("sample", dropout_rate=0.3, seed=1234, logdir=str(tmp_path))
    assert train.resume_changes(resumed, given={"dropout_rate": 0.3}) == {}  # as the advice says


def test_file_system_errors_are_one_line(copied, tmp_path, capsys):
    from support import utils

    logdir, prepro = copied
    (tmp_path / "a_file").write_text("")
    blocked = str(tmp_path / "a_file" / "log")
    for script in ("train.py", "eval.py"):
        run = run_script(script, "--logdir", blocked, "--prepro_dir", str(prepro))
        assert_one_line_error(run, r"a_file.*(Not a directory; a part of the path is a file|no saved settings)")
    run = run_script("prepro.py", "--prepro_dir", str(tmp_path / "a_file" / "p"))
    assert_one_line_error(run, r"a_file: File exists; a file of that name is in the way of a folder")
    # eval checks that it can write its results before translating anything
    shutil.rmtree(logdir / "results", ignore_errors=True)
    (logdir / "results").write_text("")
    run = run_script("eval.py", "--logdir", str(logdir), "--prepro_dir", str(prepro))
    assert_one_line_error(run, r"log/results: File exists; a file of that name is in the way")
    assert "# Translate" not in run.stdout
    # a full disk (simulated: the write fails with ENOSPC), a read-only file system
    for code, words in ((errno.ENOSPC, "No space left on device; free some space"),
                        (errno.EROFS, "Read-only file system; that file system is read-only")):
        def fail(argv, code=code):
            raise OSError(code, os.strerror(code), "/log/ckpt/E01.keras")
        with pytest.raises(SystemExit) as stop:
            utils.run_cli(fail)
        assert stop.value.code == 2
        err = capsys.readouterr().err
        assert err == f"error: /log/ckpt/E01.keras: {words}" + err.split(words)[1] and err.count("\n") == 1


def test_a_checkpoint_write_that_runs_out_of_space_leaves_nothing_half_written(copy_model, tmp_path, monkeypatch):
    """The writer fails with ENOSPC (simulated): the error reaches the caller as the OSError it is
    (run_cli makes it one line), and neither the checkpoint nor its temporary file is left."""
    import keras

    from trained import checkpoints

    model = copy_model[0]

    def full(self, path, *args, **kwargs):
        with open(path, "wb") as f:
            f.write(b"half")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)

    monkeypatch.setattr(keras.Model, "save", full)
    with pytest.raises(OSError) as failed:
        checkpoints.save(model, str(tmp_path / "ckpt" / "E01L1.00B1.00.keras"), {"epoch": 1, "batch": 0})
    assert failed.value.errno == errno.ENOSPC and os.listdir(tmp_path / "ckpt") == []


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MB tmpfs (root, where mounting is allowed)."""
    where = tmp_path / "small"
    os.makedirs(where)
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(where)],
                                           capture_output=True).returncode:
        pytest.skip("mounting a small tmpfs needs root and a system that allows it")
    yield where
    subprocess.run(["umount", str(where)])


@pytest.mark.slow
def test_training_on_a_full_disk_is_one_line_and_keeps_only_whole_files(quick_start, small_disk):
    prepro = quick_start.prepro
    run = run_script("train.py", "--logdir", str(small_disk / "log"), "--prepro_dir", str(prepro), "--num_epochs", "2",
                     "--save_every_steps", "0", "--eval_sentences", "2")
    assert_one_line_error(run, r"No space left on device; free some space there or choose another directory")
    for folder, _, files in os.walk(small_disk):
        assert not [f for f in files if f.startswith(".tmp-")], (folder, files)
        for name in files:
            if name.endswith(".keras"):
                import zipfile
                assert zipfile.ZipFile(os.path.join(folder, name)).testzip() is None


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_a_read_only_log_directory_is_one_line(copied):
    logdir, prepro = copied
    os.chmod(logdir, 0o555)
    try:
        run = run_script("train.py", "--logdir", str(logdir), "--prepro_dir", str(prepro), "--num_epochs", "31")
        assert_one_line_error(run, r"Permission denied; check that you may write there")
    finally:
        os.chmod(logdir, 0o755)


@pytest.mark.slow
def test_translate_prints_each_line_as_it_arrives_from_an_open_pipe(copied, tmp_path):
    logdir, _ = copied
    run = subprocess.Popen([sys.executable, "translate.py", "--logdir", str(logdir)], cwd=ROOT, text=True,
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        for sentence in ("Ein Mann fährt Fahrrad.", "Die Frau trinkt Kaffee."):
            run.stdin.write(sentence + "\n")
            run.stdin.flush()
            ready, _, _ = select.select([run.stdout], [], [], 120)  # the pipe stays open meanwhile
            assert ready, "no translation while the input stays open"
            assert run.stdout.readline().strip()
        run.stdin.close()
        assert run.wait(timeout=60) == 0 and run.stdout.read() == ""
    finally:
        run.kill()
    nowhere = translate(logdir, "--output", str(tmp_path / "missing" / "out.en"))
    assert_one_line_error(nowhere, r"out.en: its folder .*missing does not exist; create it first")
    assert not os.path.exists(tmp_path / "missing")

"""The JAX backend: the tests marked `jax` (every layer test, and the model and decoding tests of
code that differs between backends: saving, mixed precision, the optimizer's settings, compiled
decoding loops, beam search, a changed layer reaching every decoding path) run again under
KERAS_BACKEND=jax, and prepro -> train -> eval -> translate run on the sample corpus (one epoch of a
tiny model) with TensorFlow made unimportable (the GPU machines have JAX but no TensorFlow); its
batches come in at most 16 shapes, and a second training process finds them compiled in the cache."""
import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT
from docs_commands import TINY_MODEL

pytest.importorskip("jax")


def run(*args, timeout=900, **env):
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, **env))


def marked_tests(path):
    """How many test functions of a file carry the jax mark (all of them with a module-wide mark)."""
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        text = f.read()
    if re.search(r"^pytestmark = pytest\.mark\.jax", text, re.M):
        return len(re.findall(r"^def test_", text, re.M))
    return len(re.findall(r"^@pytest\.mark\.jax\n(?:@.*\n)*def test_", text, re.M))


MARKED = ["tests/test_modules.py", "tests/test_model.py", "tests/test_decoding.py"]


@pytest.mark.slow
def test_the_backend_specific_tests_pass_on_jax():
    # one process for the three files: JAX, TensorFlow and the shared fixtures start once
    done = run("-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", "-m", "jax", *MARKED, KERAS_BACKEND="jax")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    summary = done.stdout.strip().splitlines()[-1]
    passed = re.search(r"\b(\d+) passed\b", summary)
    assert passed and int(passed.group(1)) >= sum(marked_tests(path) for path in MARKED) > 0, summary
    assert "failed" not in summary and "error" not in summary, summary


@pytest.mark.slow
def test_train_eval_translate_on_jax_without_tensorflow(tmp_path):
    prepro_dir, logdir = str(tmp_path / "prepro"), str(tmp_path / "log")
    common = ["--prepro_dir", prepro_dir, "--logdir", logdir]
    no_tf = [os.path.join("tests", "without.py"), "tensorflow"]
    for args in (["prepro.py"], ["train.py", "--num_epochs", "1", "--eval_sentences", "5", *TINY_MODEL], ["eval.py"]):
        done = run(*no_tf, *args, *(common[:2] if args[0] == "prepro.py" else common), KERAS_BACKEND="jax")
        assert done.returncode == 0, f"{args[0]}: " + done.stdout[-2000:] + done.stderr[-3000:]
        if args[0] == "train.py":
            assert "backend jax" in done.stdout and "XLA on" in done.stdout, done.stdout[-2000:]
            assert "epoch 1: train loss" in done.stdout
            assert "ran out of data" not in done.stderr, done.stderr[-2000:]  # Keras told the epoch's length
            shapes = re.search(r"in (\d+) distinct shapes \(one XLA compilation each\), ([\d.]+)% of their tokens "
                               r"padding", done.stdout)
            assert shapes and int(shapes.group(1)) <= 16, done.stdout[-2000:]  # length_buckets' at most 16
            cache = tmp_path / "compile_cache"  # beside --logdir
            assert f"compiled programs kept in {cache}" in done.stdout
            kept = sorted(os.listdir(cache))
            assert kept, "JAX's persistent compilation cache is empty"
        if args[0] == "eval.py":
            assert "BLEU test sacreBLEU = " in done.stdout
    # the same training again, in another process and folder: every program it needs is in the cache
    kept = sorted(os.listdir(tmp_path / "compile_cache"))  # eval.py's programs too, by now
    again = run(*no_tf, "train.py", "--num_epochs", "1", "--eval_sentences", "5", *TINY_MODEL, "--prepro_dir",
                prepro_dir, "--logdir", str(tmp_path / "again"), KERAS_BACKEND="jax")
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-3000:]
    assert sorted(os.listdir(tmp_path / "compile_cache")) == kept  # found, none compiled anew
    done = subprocess.run([sys.executable, *no_tf, "translate.py", *common], cwd=ROOT,
                          input="Ein Mann fährt Fahrrad.\n\n", capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, KERAS_BACKEND="jax"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(done.stdout.splitlines()) == 2  # one line out per line in, the empty one kept

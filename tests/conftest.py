"""Shared fixtures: the project root on sys.path, small corpora written by the tests themselves;
the order in which the two test processes take the test files."""
import collections
import contextlib
import fcntl
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import typing

import pytest

import script_runner

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# For this process and every process the tests start: XLA compiles with its LLVM optimisations
# off (TensorFlow's decoding loops with --jit_compile on, every step on JAX). On the tests' tiny models compiling, not
# running, is most of that time (about a quarter less of it), and what the tests check, the results
# of the project's code, does not depend on how well the machine code is optimised.
XLA_FLAGS = os.environ.get("XLA_FLAGS", "")
if "--xla_backend_optimization_level" not in XLA_FLAGS:  # not again in a pytest started by the tests
    XLA_FLAGS = f"{XLA_FLAGS} --xla_backend_optimization_level=0".strip()
os.environ["XLA_FLAGS"] = XLA_FLAGS  # before TensorFlow or JAX is imported (XLA reads it once); inherited
SHARED = os.path.join(os.path.dirname(ROOT), "shared")
sys.path.insert(0, ROOT)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# pytest-xdist gives each test process whole files (--dist loadfile), in the order of the collection:
# the files that take longest go first, so that the two processes end together instead of one
# finishing a long file alone. Ordered by the slow tier's time per file on a 2-core CPU (pytest
# --durations=0, summed by file); files not listed follow, those with the most tests first (xdist's
# own order).
LONGEST_FIRST = ["test_settings.py", "test_docs_commands.py", "test_backends.py", "test_lesson.py",
                 "test_distributed.py", "test_resume.py", "test_reference.py", "test_export.py", "test_train.py",
                 "test_decoding.py", "test_logdir.py", "test_bench.py", "test_switches.py", "test_ablate.py",
                 "test_translate.py"]


def pytest_collection_modifyitems(config, items):
    counts = collections.Counter(item.path.name for item in items)

    def rank(item):
        name = item.path.name
        return (LONGEST_FIRST.index(name), 0) if name in LONGEST_FIRST else (len(LONGEST_FIRST), -counts[name])
    items.sort(key=rank)  # stable: a file's tests keep their order


GERMAN = ["Ein Mann fährt Fahrrad.", "Die Frau liest ein Buch.", "Das Kind spielt im Park.",
          "Zwei Hunde laufen am Strand.", "Ein Mädchen trinkt Wasser.", "Der Lehrer öffnet das Fenster."]
ENGLISH = ["A man rides a bike.", "The woman reads a book.", "The child plays in the park.",
           "Two dogs run on the beach.", "A girl drinks water.", "The teacher opens the window."]


def write_parallel(directory, prefix, src, tgt):
    os.makedirs(directory, exist_ok=True)
    for lang, lines in (("de", src), ("en", tgt)):
        with open(os.path.join(directory, f"{prefix}.{lang}"), "w", encoding="utf-8") as f:
            f.writelines(line + "\n" for line in lines)


@pytest.fixture(params=["plain", "fast"])
def kernels(request):
    """Run a test with the plain parts and with kernels/fast.py's kernels (on TensorFlow: all of them):
    the --kernels setting for a model the test builds (or model.rebuild)."""
    return request.param


def add_another_residual(monkeypatch):
    """A learner's edit to modules.DecoderBlock.call, for the tests that show it reaches every path:
    the block's input added to its output once more."""
    import functools

    import modules

    edited = modules.DecoderBlock.call

    @functools.wraps(edited)
    def another_residual(self, y, *args, **kwargs):
        out = edited(self, y, *args, **kwargs)
        return (out[0] + y,) + tuple(out[1:]) if isinstance(out, tuple) else out + y

    monkeypatch.setattr(modules.DecoderBlock, "call", another_residual)


def add_a_stack_residual(monkeypatch):
    """A learner's edit to the model's own decoder pass (model.Transformer.decoder_stack), not to a
    block: the stack's input added to its output once more."""
    import functools

    import model as transformer

    edited = transformer.Transformer.decoder_stack

    @functools.wraps(edited)
    def stack_residual(self, y, *args, **kwargs):
        out, caches, scores = edited(self, y, *args, **kwargs)
        return out + y, caches, scores

    monkeypatch.setattr(transformer.Transformer, "decoder_stack", stack_residual)


def bar_a_column(monkeypatch, column):
    """A learner's edit to the model's output layer (model.Transformer.logits): one column's logit
    lowered by 10, so that its token is hardly ever chosen."""
    import functools

    from keras import ops

    import model as transformer

    edited = transformer.Transformer.logits

    @functools.wraps(edited)
    def barred(self, y, output_matrix=None):
        logits = edited(self, y, output_matrix)  # (N, T, V')
        return logits - 10.0 * ops.cast(ops.equal(ops.arange(ops.shape(logits)[-1]), column), logits.dtype)

    monkeypatch.setattr(transformer.Transformer, "logits", barred)


@pytest.fixture
def tiny_corpus(tmp_path):
    """A parallel corpus of train/dev/test in tmp_path/raw."""
    raw = tmp_path / "raw"
    write_parallel(raw, "train", GERMAN * 5, ENGLISH * 5)
    write_parallel(raw, "dev", GERMAN[:3], ENGLISH[:3])
    write_parallel(raw, "test", GERMAN[3:], ENGLISH[3:])
    return raw


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """60 training pairs of the sample corpus, 3 dev and 3 test pairs, prepared once a test file
    (tests/test_settings.py, test_resume.py): raw/ and prepro/ (vocabulary of 100 pieces)."""
    tmp = tmp_path_factory.mktemp("settings")
    raw = tmp / "raw"
    raw.mkdir()
    for split, lines in (("train", slice(0, 60)), ("dev", slice(0, 3)), ("test", slice(0, 3))):
        for lang in ("de", "en"):
            with open(os.path.join(ROOT, "corpora", "sample", f"{split}.{lang}"), encoding="utf-8") as f:
                (raw / f"{split}.{lang}").write_text("".join(f.readlines()[lines]), encoding="utf-8")
    done = run_script("prepro.py", "--data_dir", raw, "--prepro_dir", tmp / "prepro", "--vocab_size", "100")
    assert done.returncode == 0, done.stderr[-2000:]
    return tmp



RUNNER = script_runner.Runner()  # this test process's fork server, started on first use


def bench_module(name):
    """A script of bench/ as a module, loaded by its path: "tables" alone may name another package
    (PyTables)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(f"bench_{name}", os.path.join(ROOT, "bench", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_script(*args, cwd=ROOT, timeout=600):
    """Run one of the project's scripts with this interpreter; returns the CompletedProcess. A
    script file runs in a process forked from a server that has Keras imported already
    (script_runner: seconds less a run); TESTS_FRESH_INTERPRETERS=1 starts a fresh interpreter for
    every run instead."""
    import tempfile

    command = [sys.executable, *map(str, args)]
    if args and str(args[0]).endswith(".py") and os.environ.get("TESTS_FRESH_INTERPRETERS") != "1":
        with tempfile.TemporaryDirectory() as scratch:
            done = RUNNER.run(command[1], command[2:], str(cwd), timeout, scratch)
        if done is not None:
            return subprocess.CompletedProcess(command, *done)
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def assert_one_line_error(run, pattern):
    """A script's user error: exit status 2, no traceback, and one `error:` line, the last on
    stderr, matching pattern (which names the file, and the line where there is one)."""
    errors = [line for line in run.stderr.splitlines() if line.startswith("error: ")]
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr[-3000:]
    assert len(errors) == 1 and run.stderr.strip().splitlines()[-1] == errors[0], run.stderr[-3000:]
    assert re.search(pattern, errors[0]), errors[0]


def copy_batches(seed=0):
    """batch(n): n random pairs of the copy task over ids 4-13 (2-6 tokens and </s>, padded to 8):
    source, decoder input and target, each (n, 8) int32."""
    import numpy as np

    from data_load import BOS, EOS
    rng = np.random.default_rng(seed)

    def batch(n):
        lens = rng.integers(2, 7, n)
        x, d, y = (np.zeros((n, 8), np.int32) for _ in range(3))
        for i, k in enumerate(lens):
            s = rng.integers(4, 14, k)
            x[i, :k + 1] = np.append(s, EOS)
            d[i, :k + 1] = np.insert(s, 0, BOS)
            y[i, :k + 1] = np.append(s, EOS)
        return x, d, y
    return batch


@pytest.fixture(scope="session")
def copy_model():
    """A tiny Transformer trained on the copy task, and the batch maker it learned from.

    Its weights are kept in .test-cache/ under the quick start's digest without the backend
    (quick_start_key: the code, Keras, the CPU), so a later session of the same code, or the JAX
    re-run of the tests that use it (decoding on either backend, from the same weights), loads them
    instead of training the same model again; TESTS_FRESH_QUICK_START=1 trains it anew."""
    import keras

    import hyperparams
    import model as transformer

    keras.utils.set_random_seed(0)
    hp = hyperparams.Hparams(d_model=32, d_ff=64, num_blocks=2, num_heads=4, dropout_rate=0.0,
                             lr=3e-3, warmup_steps=100, smoothing=0.0)
    m = transformer.compile_model(transformer.make_model(hp, vocab_size=14), hp)
    batch = copy_batches()
    x, d, y = batch(64 * 250)  # drawn either way: the tests' batches come after these
    key = quick_start_key(backend=False)
    kept = pathlib.Path(ROOT, ".test-cache", f"copy_model-{key}.weights.h5")
    if key is not None and os.environ.get("TESTS_FRESH_QUICK_START") != "1" and kept.exists():
        m.load_weights(kept)
        return m, batch
    m.fit((x, d), y, batch_size=64, epochs=2, verbose=0, shuffle=False)
    if key is not None:
        kept.parent.mkdir(exist_ok=True)
        part = kept.with_name(f"copy_model-{key}.tmp{os.getpid()}.weights.h5")
        m.save_weights(part)
        for older in kept.parent.glob("copy_model-*.weights.h5"):  # of other code: no use now
            if ".tmp" not in older.name and older != kept:
                older.unlink(missing_ok=True)
        os.replace(part, kept)  # whole or not at all
    return m, batch


@pytest.fixture(scope="session")
def checkouts(tmp_path_factory, quick_start):
    """checkout(document): the scratch checkout where that document's commands run
    (tests/docs_commands.py). The README's starts where the quick start ended (its folders as they
    were then, its block's results); a page of docs/ starts once the README's commands have all run."""
    import docs_commands
    made, ran = {}, {}

    def checkout(document):
        if document not in made:
            path = tmp_path_factory.mktemp("checkout")
            if document == "README.md":
                made[document] = docs_commands.Checkout(path, document, [(quick_start.untouched, folder) for folder
                                                                         in os.listdir(quick_start.untouched)], ran)
                made[document].ran_elsewhere(docs_commands.quick_start_block(), quick_start.commands)
            else:
                start = docs_commands.start_of(document)
                source = checkout("README.md").run_all().path if start else None
                made[document] = docs_commands.Checkout(path, document, [(source, folder) for folder in start], ran)
        return made[document]
    return checkout


@contextlib.contextmanager
def locked(path):
    """Hold an exclusive lock on the file at path (made if missing) for the block."""
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


class QuickStart(typing.NamedTuple):
    root: pathlib.Path  # the checkout it ran in (the paths it prints are relative to it)
    prepro: pathlib.Path  # the folders it made
    log: pathlib.Path
    dirs: list  # --prepro_dir and --logdir for another script
    commands: list  # [(command as run, CompletedProcess)]: prepro, train, eval
    untouched: pathlib.Path  # a copy of its folders as it left them, which no test changes

    @property
    def runs(self):
        """prepro, train, eval: CompletedProcess."""
        return [run for _, run in self.commands]


def quick_start_key(backend=True):
    """A digest of what the quick start's results depend on: the project's code and sample corpus,
    the test runner's own files, Keras' version and (with backend) its backend, Python and the CPU's
    instruction sets."""
    import hashlib
    import platform

    import keras
    environment = f"{sys.version} {keras.__version__} {keras.backend.backend() if backend else ''} {platform.machine()}"
    digest = hashlib.sha256(environment.encode())
    listed = subprocess.run(["git", "ls-files", "*.py", "corpora", "README.md", "requirements"], cwd=ROOT,
                            capture_output=True, text=True)
    if listed.returncode != 0:
        return None  # not a git checkout: nothing to key a kept quick start on
    files = listed.stdout.split()
    for name in sorted(files):
        digest.update(name.encode())
        with open(os.path.join(ROOT, name), "rb") as f:
            digest.update(f.read())
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            digest.update(next((line for line in f if line.startswith("flags")), "").encode())
    return digest.hexdigest()[:16]


@pytest.fixture(scope="session")
def quick_start(tmp_path_factory, worker_id):
    """The README's quick start (the sample preset: prepro, train, eval), run as typed in a scratch
    checkout once for the whole session (the first test process to need it runs it, the other
    waits and reads what it left); the other tests use the model it trains.

    What it made is kept in .test-cache/ under a digest of the code and the environment
    (quick_start_key), so the next session of the same code (`bash test.sh slow` after `bash
    test.sh`) starts from a copy of it instead of training the same model again; each session
    works on its own copy. TESTS_FRESH_QUICK_START=1 trains it anew."""
    import docs_commands
    shared = tmp_path_factory.getbasetemp()
    shared = shared if worker_id == "master" else shared.parent  # the folder every test process shares
    root, untouched, saved = shared / "quick_start", shared / "quick_start_untouched", shared / "quick_start.json"
    key = quick_start_key()
    cache = pathlib.Path(ROOT, ".test-cache", f"quick_start-{key}")
    reuse = key is not None and os.environ.get("TESTS_FRESH_QUICK_START") != "1"
    with locked(shared / "quick_start.lock"):
        if not saved.exists():
            root.mkdir()
            if reuse and (cache / "quick_start.json").exists():
                docs_commands.Checkout(root, "README.md")  # the project linked in, the user's files
                for folder in ("prepro", "log"):
                    shutil.copytree(cache / folder, root / folder)
                    shutil.copytree(cache / folder, untouched / folder)
                shutil.copy(cache / "quick_start.json", saved)
            else:
                done = docs_commands.Checkout(root, "README.md").run(docs_commands.quick_start_block())
                for folder in ("prepro", "log"):
                    shutil.copytree(root / folder, untouched / folder)
                saved.write_text(json.dumps([[command, run.args, run.returncode, run.stdout, run.stderr]
                                             for command, run in done]))
                if key is not None and all(run.returncode == 0 for _, run in done):
                    keep = cache.with_name(cache.name + f".tmp{os.getpid()}")
                    shutil.rmtree(keep, ignore_errors=True)
                    for folder in ("prepro", "log"):
                        shutil.copytree(untouched / folder, keep / folder)
                    shutil.copy(saved, keep / "quick_start.json")
                    for older in cache.parent.glob("quick_start-*"):  # of other code: no use now
                        if older != keep:
                            shutil.rmtree(older, ignore_errors=True)
                    os.replace(keep, cache)  # whole or not at all
    commands = [(command, subprocess.CompletedProcess(args, code, out, err))
                for command, args, code, out, err in json.loads(saved.read_text())]
    prepro, log = root / "prepro" / "sample", root / "log" / "sample"
    return QuickStart(root, prepro, log, ["--prepro_dir", str(prepro), "--logdir", str(log)], commands, untouched)

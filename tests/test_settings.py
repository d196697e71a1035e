"""Every setting, end to end: each value of every choice, every 0|1 switch and every number that
changes a code path is trained for an epoch at a tiny size, then evaluated (greedy and beam),
translated and drawn (tests/test_resume.py changes each resumable one on a resume).

The matrix is made from hyperparams.Hparams' own fields: a new setting joins it, or fails
test_every_setting_has_its_place_in_the_matrix until it is given one."""
import dataclasses

import pytest

import hyperparams
from conftest import assert_one_line_error, run_script

# One block a side at width 16 on a corpus of 60 pairs (one or two steps an epoch): what these tests
# check does not depend on the model's size, and tracing it is most of each run's time.
TINY = ["--d_model", "16", "--d_ff", "32", "--num_blocks", "1", "--num_heads", "2", "--tokens_per_batch", "512",
        "--num_epochs", "1"]
SENTENCE = "Das Kind kauft ein Auto."

# The numbers whose value changes which code runs (the others only scale what runs), each with the
# value the matrix trains with.
PATH_NUMBERS = {"subword_sampling": 0.1, "batch_sentences": 8, "save_every_steps": 1, "average_last": 2,
                "average_every": 1, "length_multiple": 8, "maxlen1": 30, "maxlen2": 20, "attention_dropout": 0.0,
                "eval_sentences": 2, "beam_size": 2, "weight_decay": 0.01, "smoothing": 0.0, "length_buckets": 4}
# The numbers that are only amounts (any value runs the same code), and the fields that are prepro.py's
# or name files: the matrix leaves them at the tiny run's values.
AMOUNTS = {"vocab_size", "d_model", "d_ff", "num_blocks", "num_heads", "dropout_rate", "layer_norm_epsilon",
           "tokens_per_batch", "adam_beta2", "adam_epsilon", "lr", "warmup_steps", "num_epochs", "seed",
           "eval_tokens_per_batch", "alpha", "keep_checkpoints", "keep_step_checkpoints"}
NOT_TRAINING = {"corpus": "prepro.py's (tests/test_prepro.py reads both formats)",
                "data_dir": "prepro.py's", "prepro_dir": "a folder", "logdir": "a folder", "compile_cache": "a folder",
                "train_prefix": "prepro.py's", "dev_prefix": "prepro.py's", "test_prefix": "prepro.py's",
                "src_lang": "prepro.py's", "tgt_lang": "prepro.py's"}
# Values that belong to another backend or machine: refused with one line on TensorFlow's CPU.
REFUSED = {("strategy", "data_parallel"): r"--strategy data_parallel is keras.distribution's"}


def fields():
    return {f.name: f for f in dataclasses.fields(hyperparams.Hparams)}


def matrix_cases():
    """(field, value) for every value of every choice and switch away from the default, and the
    path-changing numbers; ("default", None) first."""
    cases = [("default", None)]
    for name, f in fields().items():
        if name in NOT_TRAINING:
            continue
        default = f.default
        if f.metadata["choices"]:
            cases += [(name, value) for value in f.metadata["choices"] if value != default]
        elif isinstance(default, bool):
            cases.append((name, not default))
        elif name in PATH_NUMBERS:
            cases.append((name, PATH_NUMBERS[name]))
    return cases


def option(name, value):
    return [f"--{name}", str(int(value) if isinstance(value, bool) else value)]


def test_every_setting_has_its_place_in_the_matrix():
    placed = set(NOT_TRAINING) | set(AMOUNTS) | set(PATH_NUMBERS)
    for name, f in fields().items():
        assert f.metadata["choices"] or isinstance(f.default, bool) or name in placed, (
            f"--{name}: add it to PATH_NUMBERS (with a value to train) or AMOUNTS in tests/test_settings.py")
    assert {name for name, _ in matrix_cases()} >= {n for n, f in fields().items()
                                                    if n not in NOT_TRAINING and n not in AMOUNTS}


def train(corpus, logdir, *extra):
    return run_script("train.py", "--prepro_dir", corpus / "prepro", "--logdir", logdir, *TINY, *extra)


@pytest.mark.slow
@pytest.mark.parametrize("name,value", matrix_cases(), ids=lambda v: str(v))
def test_each_setting_trains_evaluates_translates_and_draws(corpus, tmp_path, name, value):
    given = [] if name == "default" else option(name, value)
    logdir = tmp_path / "log"
    trained = train(corpus, logdir, *given)
    if (name, value) in REFUSED:
        assert_one_line_error(trained, REFUSED[name, value])
        return
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert "epoch 1:" in trained.stdout
    for beam in ("1", "2"):
        scored = run_script("eval.py", "--logdir", logdir, "--split", "test", "--beam_size", beam)
        assert scored.returncode == 0 and "BLEU test sacreBLEU" in scored.stdout, scored.stderr[-3000:]
    translated = run_script("translate.py", "--logdir", logdir, "--input", corpus / "raw" / "test.de")
    assert translated.returncode == 0 and len(translated.stdout.splitlines()) == 3, translated.stderr[-3000:]
    drawn = run_script("attention.py", "--logdir", logdir, "--output", tmp_path / "a.png", "--encoder",
                       "--decoder_self", SENTENCE)
    assert drawn.returncode == 0 and (tmp_path / "a.png").stat().st_size > 0, drawn.stderr[-3000:]
    assert "3 kind(s) of attention" in drawn.stdout and "x 1 layers x 2 heads" in drawn.stdout

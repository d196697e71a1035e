import dataclasses
import json

import pytest

import hyperparams
from conftest import run_script
from utils import UserError


def test_presets_are_valid_and_keep_the_reference_settings():
    for name in hyperparams.PRESETS:
        hyperparams.validate(hyperparams.preset(name))
    ref = hyperparams.preset("iwslt2016")
    assert (ref.d_model, ref.d_ff, ref.num_blocks, ref.num_heads) == (512, 2048, 6, 8)
    assert (ref.vocab_size, ref.maxlen1, ref.maxlen2, ref.num_epochs) == (32000, 100, 100, 20)
    assert (ref.warmup_steps, ref.smoothing) == (4000, 0.1)


def test_overrides_for_every_field():
    hp, _, overrides = hyperparams.parse_args("t", ["--preset", "multi30k", "--d_model", "128",
                                                   "--lr", "0.002", "--logdir", "x"])
    assert (hp.d_model, hp.lr, hp.logdir) == (128, 0.002, "x")
    assert hp.d_ff == hyperparams.PRESETS["multi30k"]["d_ff"]
    assert overrides == {"d_model": 128, "lr": 0.002, "logdir": "x"}
    for text, value in (("1", True), ("true", True), ("0", False), ("no", False)):
        assert hyperparams.parse_args("t", ["--skip_nonfinite", text])[0].skip_nonfinite is value
    with pytest.raises(SystemExit):  # argparse: "invalid parse_bool value: 'maybe'", exit status 2
        hyperparams.parse_args("t", ["--skip_nonfinite", "maybe"])
    help_text = hyperparams.build_parser("t").format_help()
    for name in hyperparams.field_names():
        assert f"--{name}" in help_text


@pytest.mark.parametrize("argv, words", [
    (["--d_model", "66", "--num_heads", "4"], "not divisible by num_heads"),
    (["--tokens_per_batch", "10"], "smaller than the longest sentence"),
    (["--dropout_rate", "1.5"], "dropout_rate"),
    (["--positional", "rotary"], "positional"),
    (["--lr_decay", "cosine"], "lr_decay"),
    (["--save_every_steps", "-1"], "save_every_steps"),
])
def test_settings_that_cannot_work(argv, words):
    with pytest.raises(UserError, match=words):
        hyperparams.parse_args("t", argv)


def test_saved_settings_round_trip_and_overrides(tmp_path):
    hp = dataclasses.replace(hyperparams.preset("sample"), logdir=str(tmp_path), d_model=32)
    path = hyperparams.save_hparams(hp, str(tmp_path))
    assert json.load(open(path))["d_model"] == 32
    assert hyperparams.load_hparams(str(tmp_path)) == hp
    # eval reads the saved settings; only what the command line names replaces them
    cli = hyperparams.preset("sample")
    cli = dataclasses.replace(cli, logdir=str(tmp_path))
    got = hyperparams.settings_for_logdir(cli, {"eval_tokens_per_batch": 100})
    assert got.d_model == 32 and got.eval_tokens_per_batch == 100


def test_settings_saved_before_output_vocab_existed_mean_the_whole_vocabulary(tmp_path):
    path = hyperparams.save_hparams(hyperparams.preset("sample"), str(tmp_path))
    saved = json.load(open(path))
    assert saved.pop("output_vocab") == "target"  # the default now
    json.dump(saved, open(path, "w"))
    assert hyperparams.load_hparams(str(tmp_path)).output_vocab == "all"  # what such a run trained with


def test_missing_saved_settings_is_a_clear_error(tmp_path):
    with pytest.raises(UserError, match="no saved settings; train first"):
        hyperparams.load_hparams(str(tmp_path))


def test_help_and_bad_settings_on_the_command_line():
    ok = run_script("prepro.py", "--help")
    assert ok.returncode == 0 and "--tokens_per_batch" in ok.stdout
    bad = run_script("prepro.py", "--d_model", "30", "--num_heads", "4")
    assert bad.returncode == 2
    assert "not divisible by num_heads" in bad.stderr and "Traceback" not in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1

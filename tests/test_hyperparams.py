import dataclasses
import json

import pytest

import hyperparams
from conftest import run_script
from utils import UserError


# The reference's 2019 experiment, field by field: (Hparams field, its value, where the reference
# sets it). Files of github.com/Kyubyong/transformer (2019 version): hparams.py at 85e2dd9,
# model.py at 3a6723b, modules.py at 03e4c7c, data_load.py at 26a0847.
REFERENCE_2019 = [
    ("vocab_size", 32000, "hparams.py:7 --vocab_size 32000"),
    ("batch_sentences", 128, "hparams.py:27 --batch_size 128; data_load.py input_fn: padded_batch of random sentences"),
    ("lr", 3e-4, "hparams.py:30 --lr 0.0003 (noam_scheme's peak, reached at warmup_steps)"),
    ("warmup_steps", 4000, "hparams.py:31 --warmup_steps 4000"),
    ("num_epochs", 20, "hparams.py:33 --num_epochs 20"),
    ("d_model", 512, "hparams.py:37 --d_model 512"),
    ("d_ff", 2048, "hparams.py:39 --d_ff 2048"),
    ("num_blocks", 6, "hparams.py:41 --num_blocks 6"),
    ("num_heads", 8, "hparams.py:43 --num_heads 8"),
    ("maxlen1", 100, "hparams.py:45 --maxlen1 100"),
    ("maxlen2", 100, "hparams.py:47 --maxlen2 100"),
    ("dropout_rate", 0.3, "hparams.py:49 --dropout_rate 0.3"),
    ("smoothing", 0.1, "hparams.py:50 --smoothing 0.1 (never passed on: modules.py label_smoothing's default 0.1)"),
    ("positional", "sinusoid", "model.py:53 and :94 positional_encoding (modules.py: sin/cos table)"),
    ("lr_decay", "rsqrt",
     "model.py:150 noam_scheme (modules.py: init_lr * warmup^0.5 * min(step * warmup^-1.5, step^-0.5))"),
    ("output_vocab", "all", "model.py:125-126 logits over the whole shared matrix; :144 one_hot(y, depth=vocab_size)"),
    ("pad_logit", "zero", "model.py:36 get_token_embeddings(zero_pad=True); modules.py:51-53 the zero row is "
                          "part of the matrix that model.py:125 uses for the logits"),
    ("embedding_init", "xavier", "modules.py:50 tf.contrib.layers.xavier_initializer()"),
    ("layer_norm_epsilon", 1e-8, "modules.py:14 ln(inputs, epsilon=1e-8)"),
    ("attention_output", False, "modules.py multihead_attention: heads concatenated, then the residual; no W^O"),
    ("residual_dropout", False, "model.py:54 and :95 dropout on the embeddings, modules.py "
                                "scaled_dot_product_attention on the weights; none on sublayer outputs"),
    ("adam_beta2", 0.999, "model.py:151 tf.train.AdamOptimizer(lr): TensorFlow's default beta2"),
    ("adam_epsilon", 1e-8, "model.py:151 tf.train.AdamOptimizer(lr): TensorFlow's default epsilon"),
    ("precision", "float32", "no mixed precision anywhere: TensorFlow 1's float32 variables and ops"),
]


def test_presets_are_valid_and_the_iwslt2016_one_is_the_references_experiment():
    for name in hyperparams.PRESETS:
        hyperparams.validate(hyperparams.preset(name))
    ref = hyperparams.preset("iwslt2016")
    wrong = [f"{field}: {getattr(ref, field)!r}, the reference {value!r} ({where})"
             for field, value, where in REFERENCE_2019 if getattr(ref, field) != value]
    assert not wrong, wrong
    # the improved preset differs only in the settings README's "Beat the reference" names
    improved = hyperparams.preset("iwslt2016_improved")
    changed = {f for f in hyperparams.field_names() if getattr(ref, f) != getattr(improved, f)}
    assert changed == {"logdir", "batch_sentences", "attention_output", "residual_dropout", "layer_norm_epsilon",
                       "embedding_init", "pad_logit", "output_vocab", "adam_beta2", "adam_epsilon", "precision"}


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
    (["--beam_size", "0"], "beam_size must be at least 1"),
    (["--alpha", "-1"], "alpha must be 0"),
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
    assert ok.returncode == 0 and "--vocab_size" in ok.stdout and "--tokens_per_batch" not in ok.stdout
    bad = run_script("prepro.py", "--d_model", "30", "--num_heads", "4")  # accepted, not shown, checked
    assert bad.returncode == 2
    assert "not divisible by num_heads" in bad.stderr and "Traceback" not in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1


def help_entries(text):
    """{option: its description} from an argparse --help text."""
    entries, current = {}, None
    for line in text.splitlines():
        if line.startswith("  -"):
            head, _, rest = line.strip().partition("  ")
            current = next(t for t in head.replace(",", " ").split() if t.startswith("--"))
            entries[current] = rest.strip()
        elif current and line.startswith("     ") and line.strip():
            entries[current] = (entries[current] + " " + line.strip()).strip()
        else:
            current = None
    return entries


@pytest.mark.parametrize("script", ["train.py", "eval.py", "translate.py", "prepro.py", "hyperparams.py"])
def test_every_option_of_every_script_has_a_description(script):
    import importlib

    shown = run_script(script, "--help")
    assert shown.returncode == 0, shown.stderr[-2000:]
    entries = help_entries(shown.stdout)
    assert "--preset" in entries and "--help" in entries
    assert not [option for option, text in entries.items() if not text], entries
    settings = {"hyperparams.py": None}.get(script, getattr(importlib.import_module(script[:-3]), "SETTINGS", ()))
    for f in dataclasses.fields(hyperparams.Hparams):
        wanted = settings is None or f.name in settings or f.metadata["group"] in settings
        assert (f"--{f.name}" in entries) == wanted, (script, f.name)
    assert "(default: None)" not in shown.stdout
    if script in ("eval.py", "translate.py"):  # they decode with the run's saved settings, and say so
        assert "(default: the run's)" in entries["--beam_size"] and "(preset:" not in entries["--beam_size"]

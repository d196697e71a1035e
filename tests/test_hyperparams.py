import dataclasses
import json
import os

import pytest

import hyperparams
from conftest import ROOT, assert_one_line_error, run_script
from support.utils import UserError


# The reference's 2019 experiment, field by field: (Hparams field, its value, where the reference
# sets it). Sources: the master branch of github.com/Kyubyong/transformer (the 2019 TensorFlow 1
# version at its top level), cited by file and function (hparams.py by option), not by line, so a
# citation stays true of any checkout of that branch.
REFERENCE_2019 = [
    ("vocab_size", 32000, "hparams.py --vocab_size 32000"),
    ("batch_sentences", 128, "hparams.py --batch_size 128; data_load.py input_fn: padded_batch of random sentences"),
    ("lr", 3e-4, "hparams.py --lr 0.0003 (noam_scheme's peak, reached at warmup_steps)"),
    ("warmup_steps", 4000, "hparams.py --warmup_steps 4000"),
    ("num_epochs", 20, "hparams.py --num_epochs 20"),
    ("d_model", 512, "hparams.py --d_model 512"),
    ("d_ff", 2048, "hparams.py --d_ff 2048"),
    ("num_blocks", 6, "hparams.py --num_blocks 6"),
    ("num_heads", 8, "hparams.py --num_heads 8"),
    ("maxlen1", 100, "hparams.py --maxlen1 100"),
    ("maxlen2", 100, "hparams.py --maxlen2 100"),
    ("dropout_rate", 0.3, "hparams.py --dropout_rate 0.3"),
    ("smoothing", 0.1, "hparams.py --smoothing 0.1 (never passed on: modules.py label_smoothing's default 0.1)"),
    ("positional", "sinusoid", "model.py Transformer.encode and .decode call modules.py positional_encoding "
                               "(a sin/cos table)"),
    ("lr_decay", "rsqrt",
     "model.py Transformer.train: modules.py noam_scheme (init_lr * warmup^0.5 * min(step * warmup^-1.5, step^-0.5))"),
    ("output_vocab", "all", "model.py Transformer.decode: logits over the whole shared matrix; Transformer.train: "
                            "one_hot(y, depth=vocab_size)"),
    ("pad_logit", "zero", "model.py Transformer.__init__: get_token_embeddings(zero_pad=True); modules.py "
                          "get_token_embeddings' zero row is part of the matrix Transformer.decode uses for "
                          "the logits"),
    ("embedding_init", "xavier", "modules.py get_token_embeddings: tf.contrib.layers.xavier_initializer()"),
    ("layer_norm_epsilon", 1e-8, "modules.py ln(inputs, epsilon=1e-8)"),
    ("attention_output", False, "modules.py multihead_attention: heads concatenated, then the residual; no W^O"),
    ("residual_dropout", False, "model.py Transformer.encode and .decode: dropout on the embeddings; modules.py "
                                "scaled_dot_product_attention: on the weights; none on sublayer outputs"),
    ("adam_beta2", 0.999, "model.py Transformer.train: tf.train.AdamOptimizer(lr), TensorFlow's default beta2"),
    ("adam_epsilon", 1e-8, "model.py Transformer.train: tf.train.AdamOptimizer(lr), TensorFlow's default epsilon"),
    ("precision", "float32", "no mixed precision anywhere: TensorFlow 1's float32 variables and ops"),
]


def test_presets_are_valid_and_the_iwslt2016_one_is_the_references_experiment():
    for name in hyperparams.PRESETS:
        hyperparams.validate(hyperparams.preset(name))
    ref = hyperparams.preset("iwslt2016")
    wrong = [f"{field}: {getattr(ref, field)!r}, the reference {value!r} ({where})"
             for field, value, where in REFERENCE_2019 if getattr(ref, field) != value]
    assert not wrong, wrong
    # the improved preset differs only in the settings README's "IWSLT 2016 on a GPU" names
    improved = hyperparams.preset("iwslt2016_improved")
    changed = {f for f in hyperparams.field_names() if getattr(ref, f) != getattr(improved, f)}
    assert changed == {"logdir", "batch_sentences", "attention_output", "residual_dropout", "layer_norm_epsilon",
                       "embedding_init", "pad_logit", "output_vocab", "adam_beta2", "adam_epsilon", "precision"}
    # the reference's experiment at the laptop's size: multi30k's data and model, every other value the reference's
    small, multi30k = hyperparams.preset("multi30k_reference"), hyperparams.preset("multi30k")
    data_and_size = {"corpus", "data_dir", "prepro_dir", "dev_prefix", "test_prefix", "vocab_size", "d_model",
                     "d_ff", "num_blocks", "num_heads"}
    assert all(getattr(small, f) == getattr(multi30k, f) for f in data_and_size)
    differs = {f for f in hyperparams.field_names() if getattr(small, f) != getattr(ref, f)}
    assert differs == data_and_size | {"logdir"}, differs


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


def test_changed_names_each_setting_two_runs_differ_in_whichever_way_they_are_kept():
    a, b = hyperparams.preset("sample"), hyperparams.preset("sample", lr=2e-3, num_epochs=3)
    assert hyperparams.changed(a, b) == {"num_epochs": (30, 3), "lr": (1e-3, 2e-3)}  # in field order
    assert hyperparams.changed(a, a) == {}
    kept = json.loads(json.dumps(dataclasses.asdict(a)))  # as hparams.json or a ledger keeps them
    assert hyperparams.changed(kept, b) == hyperparams.changed(a, b)
    del kept["lr"]
    assert hyperparams.changed(kept, dict(kept, extra=1)) == {"extra": (None, 1)}
    assert hyperparams.changed(kept, a) == {"lr": (None, 1e-3)}


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
    bad = run_script("train.py", "--d_model", "30", "--num_heads", "4")
    assert_one_line_error(bad, "not divisible by num_heads")
    # a setting the script does not read is refused, not accepted and ignored
    assert_one_line_error(run_script("prepro.py", "--d_model", "30"),
                          r"^error: --d_model: not read by prepro\.py; prepro\.py --help lists the settings it reads$")


@pytest.mark.parametrize("script, required", [("eval.py", []), ("translate.py", []),
                                              ("attention.py", ["--output", "a.png", "Ein Satz."]),
                                              ("export.py", ["--format", "ctranslate2", "--output", "x"])])
def test_the_decoding_scripts_refuse_trainings_settings(script, required, tmp_path):
    """They decode with the run's saved settings: a training setting given would be silently unused."""
    run = run_script(os.path.join(ROOT, script), "--dropout_rate", "0.3", "--strategy", "mirrored", "--lr", "1",
                     *required, cwd=tmp_path)
    assert_one_line_error(run, rf"--dropout_rate, --strategy, --lr: not read by {script}; it decodes with the run's")


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


def test_a_preset_with_changes_is_the_command_lines():
    assert hyperparams.preset("sample", norm="pre") == dataclasses.replace(hyperparams.preset("sample"), norm="pre")
    with pytest.raises(UserError, match="no setting nrm"):
        hyperparams.preset("sample", nrm="pre")
    with pytest.raises(UserError, match="--norm 'middle' is not one of"):
        hyperparams.preset("sample", norm="middle")

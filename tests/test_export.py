"""export.py: the SavedModel and the CTranslate2 model translate as translate.py does, loaded by
scripts that do not import this project (run from another folder, the project not on sys.path)."""
import json
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT, add_another_residual, assert_one_line_error, run_script

# Loads the SavedModel with TensorFlow alone and prints its translations of stdin as JSON.
SAVED_MODEL = """
import json, sys
import tensorflow as tf, tensorflow_text  # noqa: F401  (registers the sentencepiece ops)
lines = sys.stdin.read().split("\\n")[:-1]
m = tf.saved_model.load(sys.argv[1])
out = [s.decode() for s in m.translate(tf.constant(lines)).numpy()]
served = m.signatures["serving_default"](sentences=tf.constant(lines[:2]))["output_0"].numpy()
print(json.dumps({"translations": out, "served": [s.decode() for s in served]}))
"""
# Loads the CTranslate2 model with ctranslate2 and sentencepiece alone.
CTRANSLATE2 = """
import json, os, sys
import ctranslate2, sentencepiece as spm
lines = sys.stdin.read().split("\\n")[:-1]
sp = spm.SentencePieceProcessor(model_file=os.path.join(sys.argv[1], "sentencepiece.model"))
translator = ctranslate2.Translator(sys.argv[1], device="cpu")
pieces = [sp.encode(line, out_type=str) for line in lines]
longest = -(-(max(map(len, pieces)) + 1) // 8) * 8  # with </s>, padded to a multiple of 8
out = translator.translate_batch(pieces, beam_size=1, max_decoding_length=int(1.5 * longest) + int(sys.argv[2]))
print(json.dumps({"translations": [sp.decode(o.hypotheses[0]) for o in out]}))
"""


def outside(script, args, lines, tmp_path):
    """Run script in tmp_path with this interpreter, the project not importable; its JSON."""
    run = subprocess.run([sys.executable, "-c", script, *args], input="".join(x + "\n" for x in lines),
                         cwd=tmp_path, capture_output=True, text=True, timeout=600,
                         env={"PATH": "/usr/bin:/bin", "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def sample_lines(quick_start):
    """The sample test sentences and translate.py's greedy translations of them."""
    dirs = quick_start.dirs
    lines = (quick_start.prepro / "test.de").read_text(encoding="utf-8").splitlines()
    run = subprocess.run([sys.executable, "translate.py", *dirs], input="".join(x + "\n" for x in lines),
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    return lines, run.stdout.split("\n")[:-1]


def agreement(got, expected):
    same = sum(a == b for a, b in zip(got, expected))
    print(f"agreement with translate.py: {same}/{len(expected)} = {same / len(expected):.1%}")
    for a, b in zip(got, expected):
        if a != b:
            print(f"  got      {a[:300]}\n  expected {b[:300]}")
    return same / len(expected)


@pytest.mark.slow
def test_saved_model_translates_as_translate_py(quick_start, sample_lines, tmp_path):
    dirs = quick_start.dirs
    lines, expected = sample_lines
    run = run_script("export.py", *dirs, "--format", "saved_model", "--output", str(tmp_path / "sm"))
    assert run.returncode == 0, run.stderr[-3000:]
    got = outside(SAVED_MODEL, [str(tmp_path / "sm")], lines, tmp_path)
    assert len(got["translations"]) == len(lines) and got["served"] == got["translations"][:2]
    assert agreement(got["translations"], expected) >= 0.95
    # an existing folder is not replaced without --force
    assert_one_line_error(run_script("export.py", *dirs, "--format", "saved_model", "--output", str(tmp_path / "sm")),
                          r"sm exists; pass --force")


@pytest.mark.slow
def test_ctranslate2_translates_as_translate_py(quick_start, sample_lines, tmp_path):
    dirs = quick_start.dirs
    lines, expected = sample_lines
    for name, extra in (("ct2", []), ("ct2-int8", ["--quantization", "int8"])):
        run = run_script("export.py", *dirs, "--format", "ctranslate2", "--output", str(tmp_path / name), *extra)
        assert run.returncode == 0, run.stderr[-3000:]
        assert (tmp_path / name / "sentencepiece.model").is_file()
    plus = "10"  # decoding.default_max_len: 1.5 T1 + 10
    float32 = outside(CTRANSLATE2, [str(tmp_path / "ct2"), plus], lines, tmp_path)["translations"]
    assert agreement(float32, expected) >= 0.95
    int8 = outside(CTRANSLATE2, [str(tmp_path / "ct2-int8"), plus], lines, tmp_path)["translations"]
    assert len(int8) == len(lines)
    agreement(int8, expected)  # reported, not asserted: int8 weights may change a choice


# Settings where the model differs from the default, each exported on its own
VARIANTS = {
    "pre-norm": dict(norm="pre"),
    "learned positions": dict(positional="learned"),
    "no W^O": dict(attention_output=False),
    "separate embeddings": dict(share_embeddings=False),
    "the reference's details": dict(attention_output=False, layer_norm_epsilon=1e-8, pad_logit="zero",
                                    embedding_init="xavier"),
}


def variant_model(settings, sp, seed=0):
    """A small untrained Transformer of these settings over sp's vocabulary (maxlen1 and maxlen2
    24: a learned position table of 24 rows), its embeddings made 5x larger (sharper logits than an
    untrained model's: no near-ties for greedy decoding)."""
    import dataclasses

    import keras
    from keras import ops

    import hyperparams
    import model as transformer

    keras.utils.set_random_seed(seed)
    hp = dataclasses.replace(hyperparams.Hparams(d_model=32, d_ff=64, num_blocks=2, num_heads=4, dropout_rate=0.0,
                                                 maxlen1=24, maxlen2=24, output_vocab="all"), **settings)
    m = transformer.make_model(hp, sp.get_piece_size())
    m.embedding.embeddings.assign(ops.convert_to_numpy(m.embedding.embeddings) * 5.0)
    return m


@pytest.fixture(scope="module")
def sample_sp(quick_start):
    import sentencepiece as spm
    return spm.SentencePieceProcessor(model_file=str(quick_start.prepro / "bpe.model"))


@pytest.mark.slow
@pytest.mark.parametrize("variant", VARIANTS)
def test_each_variant_exports_to_ctranslate2_and_scores_and_translates_as_the_model(variant, sample_sp, tmp_path):
    """Every non-default setting the specification has a place for exports: the converted model
    gives each token the model's own log-probability (serving.check_ctranslate2, run by the
    export) and translates greedily as translate.py does."""
    ctranslate2 = pytest.importorskip("ctranslate2")
    import decoding
    from trained.lines import batches, translate_lines
    from trained import serving

    m = variant_model(VARIANTS[variant], sample_sp)
    pieces = [sample_sp.id_to_piece(i) for i in range(sample_sp.get_piece_size())]
    serving.write_ctranslate2(m, pieces, str(tmp_path / "ct2"))
    lines = ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee vor einem Haus.", "Kinder."]
    want = translate_lines(m, sample_sp, lines, m.maxlen1, 2000)
    translator = ctranslate2.Translator(str(tmp_path / "ct2"), device="cpu", compute_type="float32")
    sources = [sample_sp.encode(line, out_type=str) for line in lines]
    (_, longest), = batches(m, [len(s) + 1 for s in sources], 2000, 1)  # one batch, padded as translate_lines pads it
    results = translator.translate_batch(sources, beam_size=1, max_decoding_length=decoding.default_max_len(m, longest))
    assert [sample_sp.decode(r.hypotheses[0]) for r in results] == want


@pytest.mark.slow
def test_a_model_computing_in_bfloat16_exports_as_its_float32_twin(sample_sp, tmp_path):
    """A model trained in mixed bfloat16 (the default on a CPU with bfloat16 instructions) keeps its
    weights in float32 and computes in bfloat16, whose rounding moves its logits by far more than the
    check's tolerance: write_ctranslate2 (export.py's, and bench/decode_speed.py's with --ckpt)
    converts and checks its float32 twin (the same weights, model.rebuild), which is what CTranslate2
    computes; the model checked as it computes would not pass."""
    pytest.importorskip("ctranslate2")
    import keras
    from keras import ops

    import model as transformer
    from trained import serving
    from support.utils import UserError

    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        m = variant_model({}, sample_sp)
    finally:
        keras.config.set_dtype_policy(previous)
    twin = transformer.rebuild(m, dtype="float32")  # what write_ctranslate2 does for such a model
    assert (m.compute_dtype, twin.compute_dtype) == ("bfloat16", "float32")
    assert keras.config.dtype_policy().name == previous.name  # the global policy is left as it was
    assert all(np.array_equal(a, b) for a, b in zip(m.get_weights(), twin.get_weights()))
    inputs = (np.full((2, 9), 7, np.int32), np.full((2, 7), 9, np.int32))
    gap = np.abs(ops.convert_to_numpy(m(inputs)).astype(np.float64) - ops.convert_to_numpy(twin(inputs))).max()
    assert gap > 10 * serving.SCORE_TOLERANCE
    pieces = [sample_sp.id_to_piece(i) for i in range(sample_sp.get_piece_size())]
    serving.write_ctranslate2(m, pieces, str(tmp_path / "ct2"))
    assert (tmp_path / "ct2" / "model.bin").is_file()
    with pytest.raises(UserError, match="does not score as this model does"):
        serving.check_ctranslate2(m, pieces, str(tmp_path / "ct2"))
    serving.check_ctranslate2(twin, pieces, str(tmp_path / "ct2"))


@pytest.mark.slow
def test_ctranslate2_refuses_what_it_cannot_hold(sample_sp, tmp_path, monkeypatch):
    """An edited layer (here another residual in the decoder block), another activation, a setting
    the specification does not know: each refused in one line, nothing written."""
    import keras

    from trained import serving
    from support.utils import UserError

    pieces = [sample_sp.id_to_piece(i) for i in range(sample_sp.get_piece_size())]
    m = variant_model({}, sample_sp)
    m.decoder_blocks[1].feed_forward.inner.activation = keras.activations.get("tanh")
    with pytest.raises(UserError, match="decoder_1's feed-forward activation is tanh; CTranslate2 has relu and gelu"):
        serving.write_ctranslate2(m, pieces, str(tmp_path / "tanh"))
    monkeypatch.setitem(serving.CHOICES_WRITTEN, "norm", None)
    monkeypatch.delitem(serving.CHOICES_WRITTEN, "norm")
    with pytest.raises(UserError, match="the setting norm has no place in CTranslate2's specification"):
        serving.write_ctranslate2(variant_model({}, sample_sp), pieces, str(tmp_path / "choice"))
    monkeypatch.undo()
    add_another_residual(monkeypatch)
    with pytest.raises(UserError, match=r"does not score as this model does \(a token's log-probability differs"):
        serving.write_ctranslate2(variant_model({}, sample_sp), pieces, str(tmp_path / "edited"))
    assert not (tmp_path / "tanh").exists() and not (tmp_path / "choice").exists()


@pytest.mark.slow
def test_a_variant_exports_to_a_saved_model_that_translates_as_translate_py(sample_sp, tmp_path):
    """The SavedModel runs the model's own layers; around them it cleans, cuts over-long lines and
    joins their pieces as translate.py does: lines longer than a learned position table (maxlen1
    24 here) translate through it as through translate.py, word by word where a sentence is too
    long, an over-long word cut anywhere, an empty line empty. One model holds three of the
    variants at once (learned positions, pre-norm, separate embeddings): one export, each a
    different code path of the layers it runs (a SavedModel costs half a minute to write here)."""
    pytest.importorskip("tensorflow_text")
    import types

    import tensorflow as tf

    import data_load
    from trained.lines import translate_lines
    from trained import serving

    m = variant_model({**VARIANTS["learned positions"], **VARIANTS["pre-norm"], **VARIANTS["separate embeddings"]},
                      sample_sp)
    assert m.positional == "learned" and m.encoder_norm is not None and m.source_embedding is not None
    serving.export_saved_model(types.SimpleNamespace(model=m, sp=sample_sp), str(tmp_path / "sm"))
    lines = ["Ein Mann fährt Fahrrad.",
             "Zwei Hunde spielen im Schnee vor einem Haus. Eine Frau mit einem roten Hut sieht ihnen zu, "
             "und ein Kind lacht! Dann gehen alle nach Hause; es wird dunkel.",
             "", "Ein" + "sehrlangeswort" * 6 + " und\u2028dann.",
             " ".join(["Eine Gruppe von Menschen steht vor einem großen Gebäude"] * 3)]
    assert max(len(sample_sp.encode(line)) for line in lines) > 2 * m.maxlen1
    want = translate_lines(m, sample_sp, [data_load.clean(x) for x in lines], m.maxlen1, 5000)
    loaded = tf.saved_model.load(str(tmp_path / "sm"))  # held: its functions use its variables
    got = [s.decode() for s in loaded.translate(tf.constant(lines)).numpy()]
    assert got == want and got[2] == "" and all(got[i] for i in (0, 1, 3, 4))

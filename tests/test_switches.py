"""The switches for the paper's choices (--norm, --positional none, --scale_embeddings,
--share_embeddings): each is saved with the model and loaded back, changes what it says, and
reaches every way of decoding (cached = uncached, fast kernels = plain, CTranslate2 = ours)."""
import keras
import numpy as np
import pytest
from keras import ops

import decoding
import hyperparams
import model as transformer
from conftest import copy_batches
from data_load import BOS, EOS, PAD

SWITCHED = {  # each switch away from its default, and all four at once
    "pre_norm": dict(norm="pre"),
    "no_positions": dict(positional="none"),
    "unscaled": dict(scale_embeddings=False),
    "unshared": dict(share_embeddings=False),
    "all": dict(norm="pre", positional="none", scale_embeddings=False, share_embeddings=False),
}
SOURCE = np.array([[5, 6, 7, EOS], [8, EOS, PAD, PAD]], np.int32)
TARGET_IN = np.array([[BOS, 9, 10], [BOS, 11, PAD]], np.int32)


def tiny(kernels="plain", **switches):
    hp = hyperparams.Hparams(d_model=32, d_ff=64, num_blocks=2, num_heads=4, dropout_rate=0.0, lr=3e-3,
                             warmup_steps=50, smoothing=0.0, kernels=kernels, **switches)
    keras.utils.set_random_seed(0)
    return transformer.make_model(hp, vocab_size=14), hp


def weight_names(m):
    return sorted(v.path for v in m.weights)


@pytest.mark.parametrize("name", sorted(SWITCHED))
def test_each_switch_is_saved_and_loaded_with_the_model(name, tmp_path):
    m, _ = tiny(**SWITCHED[name])
    path = str(tmp_path / "m.keras")
    m.save(path)
    loaded = keras.models.load_model(path, compile=False)
    for field, value in SWITCHED[name].items():
        assert loaded.setting(field) == value and field in hyperparams.MODEL_FIELDS
    np.testing.assert_allclose(ops.convert_to_numpy(loaded((SOURCE, TARGET_IN))),
                               ops.convert_to_numpy(m((SOURCE, TARGET_IN))), rtol=1e-5, atol=1e-5)  # plain parts


def test_each_switch_does_what_it_says():
    default, _ = tiny()
    pre, _ = tiny(norm="pre")
    assert {"transformer/encoder_norm/gamma", "transformer/decoder_norm/gamma"} <= set(weight_names(pre))
    assert not any("encoder_norm" in n for n in weight_names(default))
    unshared, _ = tiny(share_embeddings=False)
    extra = set(weight_names(unshared)) - set(weight_names(default))
    assert extra == {"transformer/source_embedding/embeddings", "transformer/embedding/output"}
    # without positions, the encoder cannot tell an order: a reversed source gives the same
    # states, reversed (the padding at the end kept where it is)
    unordered, _ = tiny(positional="none")
    x = np.array([[5, 6, 7, 8, EOS]], np.int32)
    forward = ops.convert_to_numpy(unordered.encode(x)[0])
    backward = ops.convert_to_numpy(unordered.encode(x[:, ::-1].copy())[0])
    np.testing.assert_allclose(backward[:, ::-1], forward, rtol=1e-5, atol=1e-5)
    ordered = ops.convert_to_numpy(default.encode(x[:, ::-1].copy())[0])[:, ::-1]
    assert not np.allclose(ordered, ops.convert_to_numpy(default.encode(x)[0]), atol=1e-3)
    # unscaled: the same embedding weights enter sqrt(d_model) times smaller
    unscaled, _ = tiny(scale_embeddings=False)
    unscaled.set_weights(default.get_weights())
    ids = np.array([[5, 6]], np.int32)
    np.testing.assert_allclose(ops.convert_to_numpy(unscaled.embedding(ids)) * 32 ** 0.5,
                               ops.convert_to_numpy(default.embedding(ids)), rtol=1e-6)


@pytest.fixture(scope="module")
def trained():
    """Switched models trained on the copy task (150 steps: decisive choices): pre-norm, and
    every switch at once (no positions among them)."""
    models = {}
    for name in ("pre_norm", "all"):
        m, hp = tiny(**SWITCHED[name])
        transformer.compile_model(m, hp)
        x, d, y = copy_batches(seed=1)(64 * 150)
        history = m.fit((x, d), y, batch_size=64, epochs=1, verbose=0, shuffle=False)
        models[name] = m, history.history["loss"][-1]
    return models


@pytest.mark.slow
@pytest.mark.parametrize("name", ["pre_norm", "all"])
def test_switched_models_train_and_decode_alike_on_every_path(trained, name):
    """Trained with the switches on, a model learns (its loss falls well below the uniform
    guess's), and every way of decoding agrees: cached greedy decoding gives the uncached
    (reference's) tokens with the plain and the fast kernels, and beam search of width 4 the same
    tokens with either."""
    m, loss = trained[name]
    assert loss < 0.8 * np.log(14), loss
    x, _, _ = copy_batches(seed=2)(16)
    want = decoding.greedy_decode(m, x, cached=False)
    beams = []
    for kernels in ("plain", "fast"):
        k = transformer.rebuild(m, kernels)
        np.testing.assert_array_equal(decoding.greedy_decode(k, x), want, err_msg=kernels)
        beams.append(decoding.beam_search(k, x, beam_size=4, alpha=0.6))
    np.testing.assert_array_equal(beams[0], beams[1])


@pytest.mark.slow
def test_a_switched_model_translates_the_same_in_ctranslate2(trained, tmp_path):
    """The CTranslate2 export follows the switches (pre-norm with each stack's final norm, no
    positions, unscaled and separate embeddings): its greedy outputs are ours."""
    ctranslate2 = pytest.importorskip("ctranslate2")
    from trained import serving

    m = trained["all"][0]
    pieces = ["<pad>", "<unk>", "<s>", "</s>"] + [f"w{i}" for i in range(4, 14)]
    serving.write_ctranslate2(m, pieces, str(tmp_path / "ct2"))
    x, _, _ = copy_batches(seed=3)(24)
    ours = decoding.greedy_decode(m, x)
    translator = ctranslate2.Translator(str(tmp_path / "ct2"), device="cpu")
    sources = [[pieces[i] for i in row if i not in (PAD, EOS)] for row in x]
    out = translator.translate_batch(sources, beam_size=1, max_decoding_length=ours.shape[1])
    theirs = [[pieces.index(p) for p in o.hypotheses[0]] for o in out]
    for row, got in zip(ours, theirs):
        assert list(row[:len(got)]) == got and row[len(got)] == EOS, (row, got)

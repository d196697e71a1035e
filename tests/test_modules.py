import keras
import numpy as np
import pytest
from keras import ops

import modules

pytestmark = pytest.mark.jax  # the layers in keras.ops: every test here runs under JAX too (test_backends)

N, T1, T2, D, H, F, V = 2, 7, 5, 16, 4, 32, 20


def rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype("float32")


def test_layer_output_shapes():
    ids = np.array([[5, 6, 0], [7, 0, 0]])
    emb = modules.TokenEmbedding(V, D)
    assert tuple(emb(ids).shape) == (2, 3, D)
    assert tuple(emb.project(rand(2, 3, D)).shape) == (2, 3, V)
    assert tuple(modules.PositionalEncoding(D, 10)(rand(N, T1, D)).shape) == (N, T1, D)
    assert tuple(modules.PositionalEncoding(D, 10, "learned")(rand(N, T1, D)).shape) == (N, T1, D)
    mha = modules.MultiHeadAttention(D, H)
    assert tuple(mha(rand(N, T2, D), rand(N, T1, D)).shape) == (N, T2, D)
    assert tuple(modules.FeedForward(D, F)(rand(N, T1, D)).shape) == (N, T1, D)
    mask = np.ones((N, T1), bool)
    assert tuple(modules.EncoderBlock(D, F, H)(rand(N, T1, D), mask).shape) == (N, T1, D)
    dec = modules.DecoderBlock(D, F, H)(rand(N, T2, D), rand(N, T1, D), np.ones((N, T2), bool), mask)
    assert tuple(dec.shape) == (N, T2, D)


@pytest.mark.parametrize("output_projection", [True, False])
def test_attention_projections_are_linear(output_projection):
    """The legacy reference put a ReLU on the Q/K/V projections; the paper's are linear. Over a
    single key every query gets weight 1 on its value, so the output is an affine function of the
    memory: out(a m) = a out(m) + (1 - a) out(0), negative a included (a ReLU breaks that). Without
    W^O (the reference 2019) the output is the concatenated heads, d wide as well."""
    mha = modules.MultiHeadAttention(D, H, output_projection=output_projection)
    q, m = rand(N, T2, D), rand(N, 1, D, seed=1)
    out = lambda memory: ops.convert_to_numpy(mha(q, memory))  # noqa: E731
    zero = out(np.zeros_like(m))
    for a in (-1.0, 2.0):
        np.testing.assert_allclose(out(a * m), a * out(m) + (1 - a) * zero, atol=1e-5)
    assert len(mha.weights) == (8 if output_projection else 6)


def test_returned_attention_scores_are_what_the_heads_average_over():
    """return_attention_scores (attention.py) gives the weights that produced the output: rows sum
    to 1, masked keys get none, and weights @ V through W^O is the layer's output."""
    mha = modules.MultiHeadAttention(D, H)
    q, m = rand(N, T2, D), rand(N, T1, D, seed=1)
    mask = np.ones((N, T1), bool)
    mask[1, 4:] = False
    out, weights = (ops.convert_to_numpy(t) for t in mha(q, m, attention_mask=mask, return_attention_scores=True))
    assert weights.shape == (N, H, T2, T1)
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-6)
    assert np.all(weights[1, :, :, 4:] == 0)
    v = ops.convert_to_numpy(mha.keys_values(m)[1])  # (N, h, T1, d_k)
    np.testing.assert_allclose(ops.convert_to_numpy(mha.output(weights @ v)), out, atol=1e-5)
    np.testing.assert_allclose(ops.convert_to_numpy(mha(q, m, attention_mask=mask)), out, atol=1e-6)


def test_pad_embeds_to_zeros_and_is_scaled():
    emb = modules.TokenEmbedding(V, D)
    out = ops.convert_to_numpy(emb(np.array([[0, 5]])))
    assert np.all(out[0, 0] == 0)
    w = ops.convert_to_numpy(emb.embeddings)
    np.testing.assert_allclose(out[0, 1], w[5] * np.sqrt(D), rtol=1e-6)


def test_sinusoid_matches_the_formula():
    length, d = 50, 16
    pe = ops.convert_to_numpy(modules.sinusoid(length, d))
    for pos in (0, 1, 7, 49):
        for i in range(d // 2):
            angle = pos / 10000 ** (2 * i / d)
            assert pe[pos, 2 * i] == pytest.approx(np.sin(angle), abs=1e-5)
            assert pe[pos, 2 * i + 1] == pytest.approx(np.cos(angle), abs=1e-5)


def test_label_smoothing_reference_example():
    inputs = np.array([[[0, 0, 1], [0, 1, 0], [1, 0, 0]], [[1, 0, 0], [1, 0, 0], [0, 1, 0]]], "float32")
    out = ops.convert_to_numpy(modules.label_smoothing(inputs, 0.1))
    np.testing.assert_allclose(out[0, 0], [0.03333334, 0.03333334, 0.93333334], rtol=1e-6)
    np.testing.assert_allclose(out[1, 2], [0.03333334, 0.93333334, 0.03333334], rtol=1e-6)


def test_sparse_loss_equals_smoothed_one_hot_cross_entropy_over_real_tokens():
    logits = rand(N, T2, V, seed=1)
    labels = np.array([[4, 5, 6, 0, 0], [7, 8, 9, 10, 3]])
    loss = float(modules.LabelSmoothedCrossEntropy(0.1)(labels, logits))
    targets = ops.convert_to_numpy(modules.label_smoothing(np.eye(V, dtype="float32")[labels], 0.1))
    log_p = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    ce = -(targets * log_p).sum(-1)
    mask = labels != 0
    assert loss == pytest.approx(ce[mask].mean(), rel=1e-5)


def test_loss_over_a_part_of_the_vocabulary_maps_labels_to_their_columns():
    # logits over the ids [0, 1, 2, 3, 5, 8, 9] (7 columns); id 4 is not among them: it counts as <unk>
    logits = rand(2, 3, 7, seed=3)
    label_map = np.array([0, 1, 2, 3, 1, 4, 1, 1, 5, 6])  # id -> column, <unk> (1) for ids without one
    labels = np.array([[5, 9, 3], [4, 8, 0]])
    loss = float(modules.LabelSmoothedCrossEntropy(0.1, label_map=label_map)(labels, logits))
    columns = np.array([[4, 6, 3], [1, 5, 0]])
    log_p = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    ce = -0.9 * np.take_along_axis(log_p, columns[..., None], -1)[..., 0] - 0.1 * log_p.mean(-1)
    assert loss == pytest.approx(ce[labels != 0].mean(), rel=1e-5)
    config = modules.LabelSmoothedCrossEntropy(0.1, label_map=label_map).get_config()
    assert modules.LabelSmoothedCrossEntropy.from_config(config).label_map == list(label_map)


def gradient(fn, x):
    """d fn(x) / dx on the current backend, as NumPy."""
    backend = keras.backend.backend()
    if backend == "jax":
        import jax
        return np.asarray(jax.grad(fn)(x))
    if backend == "torch":
        import torch
        x = torch.tensor(x, requires_grad=True)
        fn(x).backward()
        return x.grad.numpy()
    import tensorflow as tf
    x = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = fn(x)
    return tape.gradient(y, x).numpy()


def test_sparse_loss_gradient_is_softmax_minus_smoothed_targets():
    logits = rand(N, T2, V, seed=2)
    labels = np.array([[4, 5, 6, 0, 0], [7, 8, 9, 10, 3]])
    got = gradient(lambda z: modules.LabelSmoothedCrossEntropy(0.1)(labels, z), logits)
    targets = ops.convert_to_numpy(modules.label_smoothing(np.eye(V, dtype="float32")[labels], 0.1))
    probs = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    mask = (labels != 0)[..., None]
    np.testing.assert_allclose(got, (probs - targets) * mask / mask.sum(), atol=1e-6)


def test_learning_rate_schedule():
    s = modules.WarmupInverseSqrt(1e-3, 100)
    lr = [float(s(step)) for step in (0, 49, 99, 399)]
    assert lr[0] == pytest.approx(1e-5) and lr[1] == pytest.approx(5e-4)
    assert lr[2] == pytest.approx(1e-3) and lr[3] == pytest.approx(5e-4)


def test_linear_decay_schedule_reaches_zero_at_total_steps():
    s = modules.WarmupLinearDecay(1e-3, 100, 300)
    lr = [float(s(step)) for step in (0, 99, 199, 298, 299, 400)]
    assert lr[0] == pytest.approx(1e-5) and lr[1] == pytest.approx(1e-3) and lr[2] == pytest.approx(5e-4)
    assert lr[3] == pytest.approx(5e-6) and lr[4] == 0.0 and lr[5] == 0.0
    assert modules.WarmupLinearDecay(**s.get_config()).total_steps == 300


def test_causality_later_targets_do_not_change_earlier_outputs():
    block = modules.DecoderBlock(D, F, H)
    memory, x = rand(N, T1, D, seed=2), rand(N, T2, D, seed=3)
    changed = x.copy()
    changed[:, 3:] = rand(N, T2 - 3, D, seed=4)
    masks = (np.ones((N, T2), bool), np.ones((N, T1), bool))
    a = ops.convert_to_numpy(block(x, memory, *masks))
    b = ops.convert_to_numpy(block(changed, memory, *masks))
    np.testing.assert_allclose(a[:, :3], b[:, :3], atol=1e-5)
    assert not np.allclose(a[:, 3:], b[:, 3:], atol=1e-3)


def test_padding_what_sits_under_source_padding_changes_nothing():
    enc, dec = modules.EncoderBlock(D, F, H), modules.DecoderBlock(D, F, H)
    mask = np.array([[1, 1, 1, 1, 0, 0, 0], [1, 1, 0, 0, 0, 0, 0]], bool)
    x = rand(N, T1, D, seed=5)
    changed = np.where(mask[..., None], x, rand(N, T1, D, seed=6))
    a, b = (ops.convert_to_numpy(enc(v, mask)) for v in (x, changed))
    np.testing.assert_allclose(a[mask], b[mask], atol=1e-5)
    y, tmask = rand(N, T2, D, seed=7), np.ones((N, T2), bool)
    da, db = (ops.convert_to_numpy(dec(y, m, tmask, mask)) for m in (x, changed))
    np.testing.assert_allclose(da, db, atol=1e-5)


def test_decoder_self_attention_ignores_keys_under_the_target_padding_mask():
    """Targets are right-padded, so causality alone hides their padding from real positions; the
    target mask is tested with a hole in the middle, where only the mask can hide it."""
    block = modules.DecoderBlock(D, F, H)
    memory, source_mask = rand(N, T1, D, seed=8), np.ones((N, T1), bool)
    x = rand(N, T2, D, seed=9)
    changed = x.copy()
    changed[:, 1] = rand(N, D, seed=10)  # position 1 of every row
    hole = np.ones((N, T2), bool)
    hole[:, 1] = False
    a, b = (ops.convert_to_numpy(block(v, memory, hole, source_mask)) for v in (x, changed))
    np.testing.assert_allclose(a[:, 2:], b[:, 2:], atol=1e-5)  # later positions do not see it
    full = np.ones((N, T2), bool)  # without the hole they would
    a, b = (ops.convert_to_numpy(block(v, memory, full, source_mask)) for v in (x, changed))
    assert not np.allclose(a[:, 2:], b[:, 2:], atol=1e-3)


def test_attention_with_a_cache_equals_attention_over_the_whole_sequence():
    """Self-attention one position at a time, keys and values written into a cache, gives the
    causal self-attention of the whole sequence; cross-attention over a cache of the memory's keys
    and values gives cross-attention over the memory."""
    block = modules.DecoderBlock(D, F, H)
    memory, x = rand(N, T1, D, seed=20), rand(N, T2, D, seed=21)
    source_mask = np.array([[1] * 5 + [0] * 2, [1] * 7], bool)
    want = ops.convert_to_numpy(block(x, memory, np.ones((N, T2), bool), source_mask))  # (N, T2, d)
    cache = (ops.zeros((N, H, T2, D // H)), ops.zeros((N, H, T2, D // H)))
    cross = block.cross_attention.keys_values(memory)
    for t in range(T2):
        filled = np.arange(T2)[None] <= t  # (1, T2)
        out, cache = block(x[:, t:t + 1], None, filled, source_mask, self_cache=cache, cross_cache=cross,
                           cache_index=t)
        np.testing.assert_allclose(ops.convert_to_numpy(out)[:, 0], want[:, t], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layer, args", [
    (modules.TokenEmbedding(V, D), (np.array([[1, 2, 0]]),)),
    (modules.PositionalEncoding(D, 10, "learned"), (rand(N, T1, D),)),
    (modules.MultiHeadAttention(D, H, 0.1), (rand(N, T2, D), rand(N, T1, D))),
    (modules.FeedForward(D, F), (rand(N, T1, D),)),
    (modules.EncoderBlock(D, F, H, 0.1), (rand(N, T1, D), np.ones((N, T1), bool))),
])
def test_layers_serialize(layer, args):
    out = ops.convert_to_numpy(layer(*args))
    clone = layer.__class__.from_config(layer.get_config())
    clone(*args)
    clone.set_weights(layer.get_weights())
    np.testing.assert_allclose(ops.convert_to_numpy(clone(*args)), out, atol=1e-6)
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))
    assert restored.get_config() == layer.get_config()


# The plain layers against their formulas, written out in NumPy

def test_attention_weights_are_the_softmax_of_scaled_dot_products():
    """softmax(Q K^T / sqrt(d_k) + bias) with d_k the head width, not d_model (section 3.2.1)."""
    q, k = rand(N, H, T2, D // H, seed=30), rand(N, H, T1, D // H, seed=31)
    bias = np.where(np.arange(T1) < 5, 0.0, modules.NEG_INF).astype("float32")  # the last two keys masked
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(D // H) + bias
    want = np.exp(scores - scores.max(-1, keepdims=True))
    want /= want.sum(-1, keepdims=True)
    got = ops.convert_to_numpy(modules.attention_weights(q, k, bias))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert np.all(got[..., 5:] == 0)


def test_feed_forward_is_relu_between_two_linear_maps():
    """FFN(x) = max(0, x W1 + b1) W2 + b2 (section 3.3), on inputs whose pre-activations are
    partly negative (where the ReLU matters)."""
    ffn = modules.FeedForward(D, F)
    x = rand(N, T1, D, seed=32)
    out = ops.convert_to_numpy(ffn(x))
    w1, b1 = (ops.convert_to_numpy(w) for w in (ffn.inner.kernel, ffn.inner.bias))
    w2, b2 = (ops.convert_to_numpy(w) for w in (ffn.outer.kernel, ffn.outer.bias))
    w1, w2 = w1.reshape(D, F), w2.reshape(F, D)  # kernel-size-1 convolutions: (1, in, out)
    b1 = b1 + 0.5  # biases start at 0: move them so that a missing bias shows
    ffn.inner.bias.assign(b1)
    pre = x @ w1 + b1
    assert (pre < 0).mean() > 0.2
    np.testing.assert_allclose(ops.convert_to_numpy(ffn(x)), np.maximum(pre, 0) @ w2 + b2, rtol=1e-5, atol=1e-5)
    assert out.shape == (N, T1, D)


@pytest.mark.parametrize("epsilon", [1e-8, 1e-3, 0.5])
def test_add_norm_normalizes_the_residual_sum_with_its_epsilon(epsilon):
    """LayerNorm(x + Sublayer(x)): the residual added before the norm, the norm with the layer's
    epsilon (a large one shows when it is ignored)."""
    x, y = rand(N, T1, D, seed=33) * 0.3, rand(N, T1, D, seed=34) * 0.3
    layer = modules.AddNorm(0.0, epsilon)
    got = ops.convert_to_numpy(layer(x, sublayer=lambda _: y))
    s = x + y
    want = (s - s.mean(-1, keepdims=True)) / np.sqrt(s.var(-1, keepdims=True) + epsilon)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)

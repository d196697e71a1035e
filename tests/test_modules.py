import keras
import numpy as np
import pytest
from keras import ops

import modules

N, T1, T2, D, H, F, V = 2, 7, 5, 16, 4, 32, 20


def rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype("float32")


def test_matmul_transposed_is_a_times_b_transposed():
    a4, b4 = rand(N, H, T2, D), rand(N, H, T1, D, seed=1)  # attention logits' shapes
    np.testing.assert_allclose(ops.convert_to_numpy(modules.matmul_transposed(a4, b4)),
                               a4 @ b4.transpose(0, 1, 3, 2), rtol=1e-5, atol=1e-5)
    a3, w = rand(N, T2, D), rand(V, D, seed=2)  # the output projection's
    np.testing.assert_allclose(ops.convert_to_numpy(modules.matmul_transposed(a3, w)), a3 @ w.T,
                               rtol=1e-5, atol=1e-5)


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


@pytest.mark.skipif(keras.backend.backend() != "tensorflow",
                    reason="GuardedAdam is TensorFlow-only: train.py refuses --skip_nonfinite on other backends")
def test_guarded_adam_leaves_out_nonfinite_batches_exactly():
    """Training on [b1, bad, b2] with the guard ends where training on [b1, b2] ends."""
    x, y = rand(3, 8, 4, seed=1), rand(3, 8, 1, seed=2)
    x[1, 0, 0] = np.inf  # a batch whose loss and gradients are not finite

    def run(batches, optimizer):
        keras.utils.set_random_seed(0)
        net = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        net.compile(optimizer=optimizer, loss="mse")
        for i in batches:
            loss = net.train_on_batch(x[i], y[i])
        return net.get_weights(), optimizer, loss

    guarded, opt, _ = run([0, 1, 2], modules.GuardedAdam(learning_rate=0.1))
    plain, _, _ = run([0, 2], modules.FusedAdam(learning_rate=0.1))
    for a, b in zip(guarded, plain):
        np.testing.assert_array_equal(a, b)
    assert int(ops.convert_to_numpy(opt.iterations)) == 2 and int(ops.convert_to_numpy(opt.skipped_steps)) == 1
    broken, _, loss = run([0, 1], keras.optimizers.Adam(learning_rate=0.1))
    assert not np.isfinite(loss) and not np.isfinite(broken[0]).all()  # what the guard prevents


def numpy_adam(w, grads, lr, beta_1, beta_2, epsilon):
    """Adam (Kingma & Ba, with Keras' epsilon placement) on dense gradients, in float64."""
    m, v, w = np.zeros_like(w, np.float64), np.zeros_like(w, np.float64), w.astype(np.float64)
    for t, g in enumerate(grads, 1):
        m += (g - m) * (1 - beta_1)
        v += (g * g - v) * (1 - beta_2)
        w -= lr * np.sqrt(1 - beta_2 ** t) / (1 - beta_1 ** t) * m / (np.sqrt(v) + epsilon)
    return w


def test_fused_adam_is_adam():
    """FusedAdam follows Adam's rule, as Keras' Adam does, for dense gradients; for an embedding's
    sparse gradient with a repeated row it applies Adam to the summed gradient."""
    lr, beta_1, beta_2, epsilon = 0.01, 0.9, 0.98, 1e-9
    w0, e0 = rand(4, 3, seed=5), rand(6, 3, seed=6)
    dense = [rand(4, 3, seed=10 + t) for t in range(4)]
    ids, rows = np.array([1, 4, 1]), [rand(3, 3, seed=20 + t) for t in range(4)]  # row 1 twice
    summed = [np.zeros((6, 3), "float32") for _ in rows]
    for z, r in zip(summed, rows):
        np.add.at(z, ids, r)

    def sparse(r, z):
        if keras.backend.backend() != "tensorflow":
            return ops.convert_to_tensor(z)
        import tensorflow as tf
        return tf.IndexedSlices(tf.constant(r), tf.constant(ids), tf.constant([6, 3]))

    def run(optimizer):
        w, e = keras.Variable(w0), keras.Variable(e0)
        optimizer.build([w, e])
        for g, r, z in zip(dense, rows, summed):
            optimizer.apply([ops.convert_to_tensor(g), sparse(r, z)], [w, e])
        return ops.convert_to_numpy(w), ops.convert_to_numpy(e)

    settings = dict(learning_rate=lr, beta_1=beta_1, beta_2=beta_2, epsilon=epsilon)
    fused_w, fused_e = run(modules.FusedAdam(**settings))
    keras_w, _ = run(keras.optimizers.Adam(**settings))
    np.testing.assert_allclose(fused_w, keras_w, rtol=0, atol=1e-6)
    np.testing.assert_allclose(fused_w, numpy_adam(w0, dense, lr, beta_1, beta_2, epsilon), rtol=0, atol=1e-6)
    np.testing.assert_allclose(fused_e, numpy_adam(e0, summed, lr, beta_1, beta_2, epsilon), rtol=0, atol=1e-6)
    assert np.abs(fused_e - e0)[[1, 4]].min() > 1e-4  # the rows with gradients moved, the others not
    np.testing.assert_array_equal(fused_e[[0, 2, 3, 5]], e0[[0, 2, 3, 5]])


def test_dropout_rate_scale_and_gradient():
    """modules.Dropout drops about `rate` of the elements, scales the rest by 1 / (1 - rate),
    passes the gradient through the same mask, repeats with the seed, and is the identity at
    inference (odd sizes included, where the 16-bit halves do not pair up)."""
    for shape in ((64, 50, 32), (33, 7, 5)):
        x = np.ones(shape, "float32")
        layer = modules.Dropout(0.15, seed=3)
        np.testing.assert_array_equal(ops.convert_to_numpy(layer(x, training=False)), x)
        y = ops.convert_to_numpy(layer(x, training=True))
        np.testing.assert_allclose(y[y != 0], 1 / 0.85, rtol=1e-6)
        assert abs((y == 0).mean() - 0.15) < 5 * np.sqrt(0.15 * 0.85 / y.size)  # 5 standard deviations
        assert (ops.convert_to_numpy(modules.Dropout(0.15, seed=3)(x, training=True)) == y).all()
        assert not (ops.convert_to_numpy(layer(x, training=True)) == y).all()  # the stream moves on
        if keras.backend.backend() == "tensorflow":
            import tensorflow as tf
            w = tf.constant(rand(*shape, seed=9))
            xt = tf.constant(x)
            with tf.GradientTape() as tape:
                tape.watch(xt)
                out = modules.Dropout(0.15, seed=4)(xt, training=True)
                loss = tf.reduce_sum(out * w)
            grad = tape.gradient(loss, xt).numpy()
            np.testing.assert_allclose(grad, np.where(out.numpy() == 0, 0, w.numpy() / 0.85), rtol=1e-6)


def test_layer_normalization_equals_keras():
    """modules.LayerNormalization gives Keras' values and gradients (its own written-out gradient)."""
    x, w = rand(3, 5, D, seed=11) * 3 + 1, rand(3, 5, D, seed=12)
    ours, theirs = modules.LayerNormalization(epsilon=1e-6), keras.layers.LayerNormalization(epsilon=1e-6)
    for layer in (ours, theirs):
        layer.build((None, None, D))
        layer.gamma.assign(rand(D, seed=13))
        layer.beta.assign(rand(D, seed=14))
    np.testing.assert_allclose(ops.convert_to_numpy(ours(x)), ops.convert_to_numpy(theirs(x)), atol=1e-5)
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf
        grads = []
        for layer in (ours, theirs):
            xt = tf.constant(x)
            with tf.GradientTape() as tape:
                tape.watch(xt)
                loss = tf.reduce_sum(layer(xt) * w)
            grads.append([g.numpy() for g in tape.gradient(loss, [xt, layer.gamma.value, layer.beta.value])])
        for a, b in zip(*grads):
            np.testing.assert_allclose(a, b, atol=1e-5)


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

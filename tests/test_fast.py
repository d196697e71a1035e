"""kernels/fast.py: every kernel equals the plain part it replaces, in values and gradients, at the model's
settings and at others."""
import dataclasses

import keras
import numpy as np
import pytest
from keras import ops

import decoding
from kernels import fast
import hyperparams
import model as transformer
import modules
from data_load import EOS, PAD

N, T1, T2, D, H, V = 2, 7, 5, 16, 4, 20
TENSORFLOW = keras.backend.backend() == "tensorflow"


def rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype("float32")


def test_kernels_settings_name_the_chosen_kernels_and_parts_hold_them():
    assert fast.chosen("plain") == frozenset()
    assert fast.chosen("fast") == (set(fast.KERNELS) if TENSORFLOW else set(fast.KERNELS) - fast.TENSORFLOW_ONLY)
    assert fast.chosen("auto") == (set(fast.KERNELS) if TENSORFLOW else set())
    assert fast.chosen("dropout, beam_cache") == ({"dropout", "beam_cache"} if TENSORFLOW else {"beam_cache"})
    with pytest.raises(ValueError, match="unknown kernels flash"):
        fast.chosen("flash")
    assert fast.parts(fast.chosen("plain")) == modules.PLAIN == modules.Parts()
    chosen = fast.parts(fast.chosen("feed_forward, beam_cache"))
    assert chosen.Pointwise is fast.Pointwise and chosen.Dropout is keras.layers.Dropout
    # every part is a kernel's but decoding's cache and write, which follow how the loops are compiled
    assert {field.name for field in dataclasses.fields(modules.Parts)} == {
        f for fields in fast.PARTS.values() for f in fields} | {"slice_update", "cache"}
    assert fast.decoding_parts(chosen, xla_decoding=True) == chosen
    in_graph = fast.decoding_parts(chosen, xla_decoding=False)
    assert in_graph.slice_update is (fast.slice_update_in_graph if TENSORFLOW else ops.slice_update)
    assert in_graph.cache is (fast.GrowingCache if TENSORFLOW else modules.FixedLengthCache)
    assert dataclasses.replace(in_graph, slice_update=chosen.slice_update, cache=chosen.cache) == chosen


def test_the_write_as_one_graph_is_the_plain_write_and_compiles_nothing():
    """Decoding's write into its caches as one graph (TensorFlow's strided-slice update) gives what
    ops.slice_update gives, at steps given as ints or traced scalars, in a function of unknown shapes."""
    if not TENSORFLOW:
        pytest.skip("the write as one graph is TensorFlow's")
    import tensorflow as tf
    cache, update = rand(3, 2, 7, 4), rand(3, 2, 2, 4, seed=1)  # (N, h, L, d_k), two entries
    for step in (0, 3, 5):
        want = ops.convert_to_numpy(ops.slice_update(cache, (0, 0, step, 0), update))
        np.testing.assert_array_equal(ops.convert_to_numpy(fast.slice_update_in_graph(cache, (0, 0, step, 0), update)),
                                      want)
        traced = tf.function(lambda c, u, t: fast.slice_update_in_graph(c, (0, 0, t, 0), u), input_signature=(
            tf.TensorSpec((None, 2, None, 4)), tf.TensorSpec((None, 2, None, 4)), tf.TensorSpec((), tf.int32)))
        np.testing.assert_array_equal(traced(cache, update, tf.constant(step)).numpy(), want)
        ops_used = {node.op for node in traced.get_concrete_function().graph.as_graph_def().node}
        assert not any(op.startswith("Xla") for op in ops_used), ops_used
    # the other writes decoding makes (a step of the outputs, of beam search's hypotheses), and one
    # at two axes' starts, which is not a decoding write
    for x, start, update in ((rand(3, 7), (0, 4), rand(3, 1, seed=2)),
                             (rand(2, 6, 7), (0, 0, 4), rand(2, 6, 1, seed=3)),
                             (rand(3, 2, 7, 4), (1, 0, 2, 0), rand(2, 2, 3, 4, seed=4))):
        np.testing.assert_array_equal(ops.convert_to_numpy(fast.slice_update_in_graph(x, start, update)),
                                      ops.convert_to_numpy(ops.slice_update(x, start, update)))


def test_the_choice_of_kernels_is_one_record_with_a_field_per_place():
    """fast.choose resolves a --kernels value once: the layers' parts, the optimizer's class and the
    beam cache's layout each follow the kernels named."""
    plain, every = fast.choose("plain"), fast.choose("fast")
    assert plain.parts == modules.PLAIN and plain.optimizer is keras.optimizers.Adam and not plain.in_place_beam_cache
    assert every.names == fast.chosen("fast") and every.parts == fast.parts(every.names) and every.in_place_beam_cache
    assert every.optimizer is (fast.Adam if TENSORFLOW else keras.optimizers.Adam)
    one = fast.choose("beam_cache")
    assert one.in_place_beam_cache and one.parts == modules.PLAIN and one.optimizer is keras.optimizers.Adam


def test_two_models_with_different_kernels_live_in_one_process():
    """Each model holds the parts it was built with; building one changes nothing of another, and
    nothing of modules.py or decoding.py."""
    hp = hyperparams.Hparams(d_model=D, d_ff=32, num_blocks=1, num_heads=H, dropout_rate=0.1)
    before = (modules.FeedForward.call, modules.PLAIN, decoding.beam_loop)
    fast_model = transformer.make_model(dataclasses.replace(hp, kernels="fast"), V)
    plain_model = transformer.make_model(dataclasses.replace(hp, kernels="plain"), V)
    assert (modules.FeedForward.call, modules.PLAIN, decoding.beam_loop) == before
    assert plain_model.kernels.parts == modules.PLAIN and fast_model.kernels.parts == fast.parts(fast.chosen("fast"))
    assert fast_model.kernels.in_place_beam_cache and not plain_model.kernels.names
    assert type(fast_model.decoder_blocks[0].feed_forward.inner) is fast.Pointwise
    assert type(plain_model.decoder_blocks[0].feed_forward.inner) is modules.PointwiseConv
    norm = type(fast_model.decoder_blocks[0].feed_forward_norm.norm)
    assert norm is (fast.LayerNormalization if TENSORFLOW else keras.layers.LayerNormalization)
    assert type(plain_model.decoder_blocks[0].feed_forward_norm.norm) is keras.layers.LayerNormalization
    assert type(plain_model.source_dropout) is keras.layers.Dropout
    query = type(fast_model.decoder_blocks[0].self_attention.query_dense)
    assert query is (fast.Dense if TENSORFLOW else keras.layers.Dense)
    assert type(plain_model.decoder_blocks[0].self_attention.query_dense) is keras.layers.Dense
    assert plain_model.embedding.matmul_transposed is modules.matmul_transposed


def test_fast_imports_no_decoding_and_no_model():
    """kernels/fast.py stands under the layers: it imports modules.py, never what is built from it."""
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(fast))
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
                for alias in (node.names if isinstance(node, ast.Import) else [ast.alias(node.module or "")])}
    assert imported <= {"dataclasses", "keras", "modules", "tensorflow"}, imported


def model_and_gradients(kernels, weights=None):
    """A small Transformer built with `kernels` (dropout 0, so every kernel is deterministic), its
    logits on a fixed batch and the gradients of its loss with respect to every weight."""
    hp = hyperparams.Hparams(d_model=D, d_ff=32, num_blocks=2, num_heads=H, dropout_rate=0.0,
                             kernels=kernels)
    m = transformer.compile_model(transformer.make_model(hp, V), hp)
    if weights is not None:
        m.set_weights(weights)
    source = np.array([[5, 6, 7, 8, EOS, PAD, PAD], [9, 10, 11, 12, 13, 14, EOS]], np.int32)
    target_in = np.array([[2, 5, 6, 7, PAD], [2, 9, 10, 11, 12]], np.int32)
    labels = np.array([[5, 6, 7, EOS, PAD], [9, 10, 11, 12, EOS]], np.int32)
    logits = m((source, target_in), training=False)
    if not TENSORFLOW:
        return m, ops.convert_to_numpy(logits), None
    import tensorflow as tf
    with tf.GradientTape() as tape:
        loss = m.loss(labels, m((source, target_in), training=True))
    grads = tape.gradient(loss, m.trainable_variables)
    return m, ops.convert_to_numpy(logits), [ops.convert_to_numpy(tf.convert_to_tensor(g)) for g in grads]


@pytest.mark.parametrize("kernels", ["projections", "feed_forward", "layer_norm", "cross_entropy", "fast"])
def test_each_drop_in_gives_the_plain_models_values_and_gradients(kernels):
    """The model with one kernel (or all of them), on the plain model's weights: the same logits and
    the same gradient of the loss for every weight, within float32 rounding."""
    keras.utils.set_random_seed(0)
    plain, plain_logits, plain_grads = model_and_gradients("plain")
    _, logits, grads = model_and_gradients(kernels, plain.get_weights())
    np.testing.assert_allclose(logits, plain_logits, rtol=1e-5, atol=1e-5)
    if grads is not None:
        for g, want, v in zip(grads, plain_grads, plain.trainable_variables):
            np.testing.assert_allclose(g, want, rtol=1e-4, atol=1e-6, err_msg=v.path)
        assert max(np.abs(g).max() for g in grads) > 1e-3  # gradients that say something


def test_the_fast_loss_equals_the_plain_loss_in_values_and_gradients():
    """At the paper's smoothing and others, over two vocabulary sizes."""
    for vocab in (V, 7):
        logits = rand(N, T2, vocab, seed=1) * 3
        labels = np.random.default_rng(2).integers(0, vocab, (N, T2)).astype(np.int32)
        w = rand(N, T2, seed=3)
        for epsilon in (0.0, 0.1, 0.3):
            want = ops.convert_to_numpy(modules.smoothed_cross_entropy(logits, labels, epsilon))
            got = ops.convert_to_numpy(fast.smoothed_cross_entropy(logits, labels, epsilon))
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
            if TENSORFLOW:
                import tensorflow as tf
                grads = []
                for loss in (fast.smoothed_cross_entropy, modules.smoothed_cross_entropy):
                    z = tf.constant(logits)
                    with tf.GradientTape() as tape:
                        tape.watch(z)
                        total = tf.reduce_sum(loss(z, tf.constant(labels), epsilon) * w)
                    grads.append(tape.gradient(total, z).numpy())
                np.testing.assert_allclose(grads[0], grads[1], rtol=1e-5, atol=1e-6)


def test_a_checkpoint_saved_with_fast_kernels_loads_with_plain_ones(tmp_path):
    """Same weights, same saved format: saved under fast, loaded under plain, equal outputs."""
    keras.utils.set_random_seed(1)
    hp = hyperparams.Hparams(d_model=D, d_ff=32, num_blocks=2, num_heads=H, kernels="fast", output_vocab="all")
    m = transformer.make_model(hp, V)
    src = np.array([[5, 6, 7, EOS]], np.int32)
    want = ops.convert_to_numpy(m((src, src), training=False))
    path = str(tmp_path / "m.keras")
    m.save(path)
    from trained import checkpoints
    loaded = checkpoints.load(path, dataclasses.replace(hp, kernels="plain"))
    assert type(loaded.decoder_blocks[0].feed_forward_norm.norm) is keras.layers.LayerNormalization
    np.testing.assert_allclose(ops.convert_to_numpy(loaded((src, src), training=False)), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rate", [0.15, 0.05, 0.5])
def test_dropout_rate_scale_and_gradient(rate):
    """fast.Dropout drops about `rate` of the elements, scales the rest by 1 / (1 - rate),
    passes the gradient through the same mask, repeats with the seed, and is the identity at
    inference (odd sizes included, where the 16-bit halves do not pair up); at the default rate
    and others."""
    for shape in ((64, 50, 32), (33, 7, 5)):
        x = np.ones(shape, "float32")
        layer = fast.Dropout(rate, seed=3)
        np.testing.assert_array_equal(ops.convert_to_numpy(layer(x, training=False)), x)
        y = ops.convert_to_numpy(layer(x, training=True))
        np.testing.assert_allclose(y[y != 0], 1 / (1 - rate), rtol=1e-6)
        assert abs((y == 0).mean() - rate) < 5 * np.sqrt(rate * (1 - rate) / y.size)  # 5 standard deviations
        assert (ops.convert_to_numpy(fast.Dropout(rate, seed=3)(x, training=True)) == y).all()
        assert not (ops.convert_to_numpy(layer(x, training=True)) == y).all()  # the stream moves on
        if TENSORFLOW:
            import tensorflow as tf
            w = tf.constant(rand(*shape, seed=9))
            xt = tf.constant(x)
            with tf.GradientTape() as tape:
                tape.watch(xt)
                out = fast.Dropout(rate, seed=4)(xt, training=True)
                loss = tf.reduce_sum(out * w)
            grad = tape.gradient(loss, xt).numpy()
            np.testing.assert_allclose(grad, np.where(out.numpy() == 0, 0, w.numpy() / (1 - rate)), rtol=1e-6)


def gradients(layer, x, w):
    """d sum(layer(x) * w) / d (x, each weight of layer), as NumPy arrays (TensorFlow)."""
    import tensorflow as tf

    xt = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(xt)
        loss = tf.reduce_sum(tf.cast(layer(xt), tf.float32) * w)
    return [g.numpy() for g in tape.gradient(loss, [xt] + [v.value for v in layer.trainable_variables])]


@pytest.mark.parametrize("filters, activation, use_bias, shape", [
    (32, "relu", True, (N, T1, D)),  # the feed-forward's inner convolution
    (D, None, True, (N, T1, 32)),  # its outer one
    (8, "gelu", False, (3, 1, 12)),  # settings the model does not use
])
def test_pointwise_equals_the_kernel_size_1_convolution(filters, activation, use_bias, shape):
    """fast.Pointwise gives modules.PointwiseConv's values and gradients, whatever its width,
    activation and bias, on the same weights."""
    x, w = rand(*shape, seed=21), rand(*shape[:-1], filters, seed=22)
    plain = modules.PointwiseConv(filters, activation=activation, use_bias=use_bias)
    ours = fast.Pointwise(filters, activation=activation, use_bias=use_bias)
    plain.build(shape)
    ours.build(shape)
    ours.set_weights([rand(*v.shape, seed=23 + i) for i, v in enumerate(ours.weights)])
    plain.set_weights(ours.get_weights())
    np.testing.assert_allclose(ops.convert_to_numpy(ours(x)), ops.convert_to_numpy(plain(x)), rtol=1e-5, atol=1e-5)
    if TENSORFLOW:
        for a, b in zip(gradients(ours, x, w), gradients(plain, x, w)):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("units, activation, use_bias, shape", [
    (D, None, True, (N, T1, D)),  # the attention's projections over a sequence
    (D, None, True, (N, 1, D)),  # over one decoding step
    (8, "relu", False, (3, 2, 5, 12)),  # settings and ranks the model does not use
    (8, None, True, (3, 12)),
])
def test_dense_equals_keras_dense(units, activation, use_bias, shape):
    """fast.Dense (its matmul as one 2-D product of the rows) gives keras.layers.Dense's values and
    gradients on the same weights, on tensors of any rank; and as one graph whose middle axes are
    of unknown length."""
    x, w = rand(*shape, seed=31), rand(*shape[:-1], units, seed=32)
    plain = keras.layers.Dense(units, activation=activation, use_bias=use_bias)
    ours = fast.Dense(units, activation=activation, use_bias=use_bias)
    plain.build(shape)
    ours.build(shape)
    ours.set_weights([rand(*v.shape, seed=33 + i) for i, v in enumerate(ours.weights)])
    plain.set_weights(ours.get_weights())
    expected = ops.convert_to_numpy(plain(x))
    np.testing.assert_allclose(ops.convert_to_numpy(ours(x)), expected, rtol=1e-5, atol=1e-5)
    if TENSORFLOW:
        import tensorflow as tf

        for a, b in zip(gradients(ours, x, w), gradients(plain, x, w)):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
        unknown = tf.function(ours, input_signature=[tf.TensorSpec((None,) * len(shape[:-1]) + shape[-1:])])
        np.testing.assert_allclose(unknown(x).numpy(), expected, rtol=1e-5, atol=1e-5)


def test_matmul_rows_transposed_equals_the_plain_product():
    """The output logits' product, x times the transposed output matrix, as fast's 2-D matmul: the
    plain modules.matmul_transposed's values and gradients; a weight of higher rank (attention's
    Q K^T) goes to the plain product."""
    x, m, w = rand(N, 3, D, seed=41), rand(17, D, seed=42), rand(N, 3, 17, seed=43)
    expected = ops.convert_to_numpy(modules.matmul_transposed(x, m))
    np.testing.assert_allclose(ops.convert_to_numpy(fast.matmul_rows_transposed(x, m)), expected, rtol=1e-5, atol=1e-5)
    k = rand(N, 4, D, seed=44)
    np.testing.assert_allclose(ops.convert_to_numpy(fast.matmul_rows_transposed(x, k)),
                               ops.convert_to_numpy(modules.matmul_transposed(x, k)), rtol=1e-5, atol=1e-5)
    if TENSORFLOW:
        import tensorflow as tf

        def grads(fn):
            xs, ms = tf.constant(x), tf.constant(m)
            with tf.GradientTape() as tape:
                tape.watch([xs, ms])
                loss = tf.reduce_sum(fn(xs, ms) * w)
            return [g.numpy() for g in tape.gradient(loss, [xs, ms])]

        for a, b in zip(grads(fast.matmul_rows_transposed), grads(modules.matmul_transposed)):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("epsilon, scale", [(1e-6, 3.0), (1e-8, 3.0), (0.5, 0.3)])
def test_layer_normalization_equals_keras(epsilon, scale):
    """fast.LayerNormalization gives Keras' values and gradients (its own written-out gradient), at
    the model's epsilons and at one large enough to change every value (inputs of small variance)."""
    x, w = rand(3, 5, D, seed=11) * scale + 1, rand(3, 5, D, seed=12)
    ours, theirs = fast.LayerNormalization(epsilon=epsilon), keras.layers.LayerNormalization(epsilon=epsilon)
    for layer in (ours, theirs):
        layer.build((None, None, D))
        layer.gamma.assign(rand(D, seed=13))
        layer.beta.assign(rand(D, seed=14))
    np.testing.assert_allclose(ops.convert_to_numpy(ours(x)), ops.convert_to_numpy(theirs(x)), atol=1e-5)
    if TENSORFLOW:
        for a, b in zip(gradients(ours, x, w), gradients(theirs, x, w)):
            np.testing.assert_allclose(a, b, atol=1e-5)


def numpy_adam(w, grads, lr, beta_1, beta_2, epsilon):
    """Adam (Kingma & Ba, with Keras' epsilon placement) on dense gradients, in float64."""
    m, v, w = np.zeros_like(w, np.float64), np.zeros_like(w, np.float64), w.astype(np.float64)
    for t, g in enumerate(grads, 1):
        m += (g - m) * (1 - beta_1)
        v += (g * g - v) * (1 - beta_2)
        w -= lr * np.sqrt(1 - beta_2 ** t) / (1 - beta_1 ** t) * m / (np.sqrt(v) + epsilon)
    return w


@pytest.mark.parametrize("lr, beta_1, beta_2, epsilon", [(0.01, 0.9, 0.98, 1e-9), (0.03, 0.8, 0.9, 0.1)])
def test_fused_adam_is_adam(lr, beta_1, beta_2, epsilon):
    """fast.Adam follows Adam's rule, as Keras' Adam does, for dense gradients; for an embedding's
    sparse gradient with a repeated row it applies Adam to the summed gradient. At the paper's
    settings and at others where each of them changes the update (an epsilon near sqrt(v))."""
    w0, e0 = rand(4, 3, seed=5), rand(6, 3, seed=6)
    dense = [rand(4, 3, seed=10 + t) for t in range(4)]
    ids, rows = np.array([1, 4, 1]), [rand(3, 3, seed=20 + t) for t in range(4)]  # row 1 twice
    summed = [np.zeros((6, 3), "float32") for _ in rows]
    for z, r in zip(summed, rows):
        np.add.at(z, ids, r)

    def sparse(r, z):
        if not TENSORFLOW:
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
    fused_w, fused_e = run(fast.Adam(**settings))
    keras_w, _ = run(keras.optimizers.Adam(**settings))
    np.testing.assert_allclose(fused_w, keras_w, rtol=0, atol=1e-6)
    np.testing.assert_allclose(fused_w, numpy_adam(w0, dense, lr, beta_1, beta_2, epsilon), rtol=0, atol=1e-6)
    np.testing.assert_allclose(fused_e, numpy_adam(e0, summed, lr, beta_1, beta_2, epsilon), rtol=0, atol=1e-6)
    assert np.abs(fused_e - e0)[[1, 4]].min() > 1e-4  # the rows with gradients moved, the others not
    np.testing.assert_array_equal(fused_e[[0, 2, 3, 5]], e0[[0, 2, 3, 5]])


@pytest.mark.skipif(not TENSORFLOW, reason="the fused update is a TensorFlow kernel")
def test_fused_adam_runs_the_fused_kernel(monkeypatch):
    """The update goes through ResourceApplyAdam (not Keras' fallback), and the training model
    gets fast.Adam under --kernels auto, Keras' Adam under plain."""
    import tensorflow as tf

    calls = []
    kernel = tf.raw_ops.ResourceApplyAdam
    monkeypatch.setattr(tf.raw_ops, "ResourceApplyAdam", lambda **kw: calls.append(1) or kernel(**kw))
    w = keras.Variable(rand(4, 3))
    optimizer = fast.Adam(learning_rate=0.01)
    optimizer.apply([ops.convert_to_tensor(rand(4, 3, seed=1))], [w])
    assert calls == [1]
    hp = dataclasses.replace(hyperparams.preset("sample"), d_model=16, d_ff=32, num_blocks=1, num_heads=2)
    for kernels, adam in (("auto", fast.Adam), ("plain", keras.optimizers.Adam)):
        hp = dataclasses.replace(hp, kernels=kernels)
        m = transformer.compile_model(transformer.make_model(hp, 40), hp, total_steps=10)
        assert type(m.optimizer) is adam


@pytest.mark.slow
def test_beam_search_with_caches_in_place_equals_the_reordering_one(copy_model):
    """Beam search keeping caches in place returns the ids and scores of the plain beam search,
    which reorders them (trained copy model, longer inputs than it learned, beam 4 and 5)."""
    plain, in_place = (transformer.rebuild(copy_model[0], kernels) for kernels in ("plain", "beam_cache"))
    assert in_place.kernels.in_place_beam_cache and not plain.kernels.in_place_beam_cache
    rng = np.random.default_rng(7)
    x = np.zeros((30, 16), np.int32)
    for row, length in zip(x, rng.integers(5, 13, len(x))):
        row[:length + 1] = np.append(rng.integers(4, 14, length), EOS)
    for beam_size in (4, 5):
        want_ids, want_scores = decoding.beam_search(plain, x, beam_size=beam_size, alpha=0.6, return_scores=True)
        ids, scores = decoding.beam_search(in_place, x, beam_size=beam_size, alpha=0.6, return_scores=True)
        np.testing.assert_array_equal(ids, want_ids)
        np.testing.assert_allclose(scores, want_scores, rtol=1e-4, atol=1e-4)

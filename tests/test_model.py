import dataclasses

import keras
import numpy as np
import pytest
from keras import ops

import decoding
from support import devices
import hyperparams
import model as transformer
from conftest import copy_batches
from data_load import BOS, EOS, PAD
from support.utils import UserError, cpu_flags


def tiny(**kw):
    hp = hyperparams.Hparams(d_model=32, d_ff=64, num_blocks=2, num_heads=4, dropout_rate=0.0, **kw)
    return transformer.make_model(hp, vocab_size=14), hp


def test_forward_shape_and_padding_length_invariance():
    m, _ = tiny()
    src = np.array([[5, 6, 7, EOS, PAD, PAD]])
    tgt = np.array([[BOS, 8, 9, PAD]])
    out = ops.convert_to_numpy(m((src, tgt)))
    assert out.shape == (1, 4, 14)
    longer = np.concatenate([src, np.zeros((1, 5), int)], axis=1)  # more padding: same outputs
    np.testing.assert_allclose(ops.convert_to_numpy(m((longer, tgt)))[0, :3], out[0, :3], atol=1e-5)


def test_learning_rate_schedule_of_each_decay():
    assert float(transformer.learning_rate(hyperparams.Hparams(lr=1e-3, warmup_steps=10))(999)) > 0
    linear = hyperparams.Hparams(lr=1e-3, warmup_steps=10, lr_decay="linear")
    with pytest.raises(ValueError, match="number of training steps"):
        transformer.learning_rate(linear)
    schedule = transformer.learning_rate(linear, total_steps=50)
    again = keras.optimizers.schedules.deserialize(keras.optimizers.schedules.serialize(schedule))
    assert float(again(49)) == 0.0 and float(again(29)) == pytest.approx(float(schedule(29)))


@pytest.mark.jax
def test_save_and_load_give_identical_outputs(tmp_path):
    m, hp = tiny()
    transformer.compile_model(m, hp)
    x = np.array([[5, 6, 7, EOS], [8, EOS, PAD, PAD]])
    y = np.array([[BOS, 9, 10], [BOS, 11, PAD]])
    m.train_on_batch((x, y), np.array([[9, 10, EOS], [11, EOS, PAD]]))
    path = str(tmp_path / "m.keras")
    m.save(path)
    loaded = keras.models.load_model(path)  # with the plain parts: the kernels are not saved
    assert loaded.kernels.names == frozenset()
    np.testing.assert_allclose(ops.convert_to_numpy(loaded((x, y))), ops.convert_to_numpy(m((x, y))), rtol=1e-5,
                               atol=1e-5)
    assert int(loaded.optimizer.iterations.numpy()) == 1
    np.testing.assert_array_equal(decoding.greedy_decode(loaded, x, max_len=6), decoding.greedy_decode(m, x, max_len=6))


OUTPUT_IDS = [0, 1, 2, 3, 5, 6, 9, 11, 12]  # the ids a model of 14 may output in the tests below


def test_output_ids_give_those_columns_of_the_full_logits(tmp_path):
    full, hp = tiny()
    part = transformer.make_model(hp, 14, OUTPUT_IDS)
    part.set_weights(full.get_weights())  # the same weights: output_ids add none
    src = np.array([[5, 6, 7, EOS], [8, EOS, PAD, PAD]])
    tgt = np.array([[BOS, 9, 10], [BOS, 11, PAD]])
    want = ops.convert_to_numpy(full((src, tgt)))[..., OUTPUT_IDS]
    np.testing.assert_allclose(ops.convert_to_numpy(part((src, tgt))), want, rtol=1e-5, atol=1e-5)
    assert (part.output_size, part.output_vocab, full.output_vocab) == (9, "target", "all")
    path = str(tmp_path / "m.keras")
    part.save(path)
    loaded = keras.models.load_model(path, compile=False)
    assert loaded.output_ids == OUTPUT_IDS
    np.testing.assert_allclose(ops.convert_to_numpy(loaded((src, tgt))), ops.convert_to_numpy(part((src, tgt))),
                               rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="starting with 0, 1, 2, 3"):
        transformer.make_model(hp, 14, [0, 1, 3, 5])
    label_map = part.label_map()
    assert [label_map[i] for i in OUTPUT_IDS] == list(range(9)) and label_map[7] == 1  # 7: no column, <unk>


@pytest.mark.slow
@pytest.mark.jax
def test_decoding_with_output_ids_returns_ids_and_their_scores():
    """Greedy (cached, uncached) and beam search of a model whose logits cover OUTPUT_IDS return ids
    from OUTPUT_IDS, each the best of them by the full model's logits restricted to those columns."""
    keras.utils.set_random_seed(5)
    full, hp = tiny()
    part = transformer.make_model(hp, 14, OUTPUT_IDS)
    part.set_weights(full.get_weights())
    src = np.random.default_rng(2).integers(4, 14, (5, 6)).astype(np.int32)
    ids, scores = decoding.greedy_decode(part, src, max_len=8, min_len=8, return_scores=True)  # </s> barred: 8 steps
    assert set(np.unique(ids)) <= set(OUTPUT_IDS)
    uncached, uncached_scores = decoding.greedy_decode(part, src, max_len=8, min_len=8, cached=False,
                                                       return_scores=True)
    np.testing.assert_array_equal(ids, uncached)
    np.testing.assert_allclose(scores, uncached_scores, rtol=1e-4)
    # the full model over the decoded prefixes, its logits restricted to OUTPUT_IDS (<pad>, <s>, </s> barred)
    target_in = np.concatenate([np.full((5, 1), BOS), ids[:, :-1]], axis=1)
    logits = ops.convert_to_numpy(full((src, target_in)))[..., OUTPUT_IDS]  # (5, 8, 9)
    log_p = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    log_p[..., [PAD, BOS, EOS]] = -np.inf
    np.testing.assert_array_equal(np.asarray(OUTPUT_IDS)[log_p.argmax(-1)], ids)
    np.testing.assert_allclose(log_p.max(-1).sum(-1), scores, rtol=1e-4)
    beam, beam_scores = decoding.beam_search(part, src, beam_size=1, alpha=0.0, max_len=8, min_len=8,
                                             return_scores=True)
    np.testing.assert_array_equal(beam, ids)
    np.testing.assert_allclose(beam_scores, scores, rtol=1e-4)
    beam4 = decoding.beam_search(part, src, beam_size=4, max_len=8)
    assert set(np.unique(beam4)) <= set(OUTPUT_IDS)


def test_greedy_decode_stops_at_eos_and_pads_after():
    m, _ = tiny()
    script = np.array([[7, EOS, 9, 9, 9], [8, 8, 8, EOS, 9]])  # what each row "predicts" per step

    def fake_uncached_greedy_step(target_in, memory, source_mask, allow_eos):
        t = target_in.shape[1]
        return ops.convert_to_tensor(script[:, t - 1]), ops.zeros((2,))

    m.__dict__["_compiled_fns"] = {decoding.uncached_greedy_step: fake_uncached_greedy_step}  # run as is, not traced
    out = decoding.greedy_decode(m, np.array([[5, EOS], [6, EOS]]), max_len=5, cached=False)
    assert out.tolist() == [[7, EOS, PAD, PAD], [8, 8, 8, EOS]]  # stops once all are done


def test_copy_task_learns_to_exact_match(copy_model):
    """A tiny Transformer learns to copy random sequences (harvardnlp's sanity check)."""
    m, batch = copy_model
    tx, _, ty = batch(200)
    out = decoding.greedy_decode(m, tx, max_len=8)
    hits = sum(list(o[:list(t).index(EOS) + 1]) == list(t[:list(t).index(EOS) + 1]) for o, t in zip(out, ty))
    assert hits / len(ty) >= 0.95, f"copy exact match {hits}/{len(ty)}"


def test_auto_precision_is_bfloat16_only_on_a_cpu_with_bfloat16_instructions(tmp_path):
    hp = hyperparams.Hparams(precision="auto")
    if devices.gpus():
        pytest.skip("the CPU rule applies on a machine without a GPU")
    bf16 = "mixed_bfloat16" if keras.backend.backend() == "tensorflow" else "float32"  # TensorFlow's oneDNN only
    assert devices.precision(hp, flags={"avx512f", "avx512_bf16"}) == bf16
    assert devices.precision(hp, flags={"amx_bf16"}) == bf16
    assert devices.precision(hp, flags={"avx2", "avx512f"}) == "float32"
    assert devices.precision(hyperparams.Hparams(precision="float32"), flags={"avx512_bf16"}) == "float32"
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse avx512_bf16 avx2\n\nprocessor\t: 1\n")
    assert cpu_flags(str(cpuinfo)) == {"fpu", "sse", "avx512_bf16", "avx2"}
    assert cpu_flags(str(tmp_path / "missing")) == set()


@pytest.mark.slow
@pytest.mark.jax
@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16"])
def test_mixed_precision_trains_with_float32_logits_and_loss_scaling(policy):
    keras.mixed_precision.set_global_policy(policy)
    try:
        keras.utils.set_random_seed(0)
        m, hp = tiny()
        transformer.compile_model(m, hp)
        assert m.embedding.embeddings.dtype == "float32"  # weights stay float32
        x = np.array([[5, 6, 7, EOS], [8, EOS, PAD, PAD]])
        d = np.array([[BOS, 9, 10], [BOS, 11, PAD]])
        y = np.array([[9, 10, EOS], [11, EOS, PAD]])
        assert keras.backend.standardize_dtype(m((x, d)).dtype) == "float32"  # logits for softmax and loss
        assert isinstance(m.optimizer, keras.optimizers.LossScaleOptimizer) == (policy == "mixed_float16")
        losses = [float(m.train_on_batch((x, d), y)) for _ in range(5)]
        assert all(np.isfinite(losses)) and losses[-1] < losses[0]
        assert decoding.greedy_decode(m, x, max_len=6).shape[0] == 2
    finally:
        keras.mixed_precision.set_global_policy("float32")


def test_the_references_settings_zero_pad_logit_xavier_embeddings_no_wo_no_residual_dropout():
    """--preset iwslt2016's model choices: the <pad> logit is 0 whatever the weights (the reference's
    zero row in the shared matrix); embeddings start Glorot uniform, as its xavier_initializer;
    attention has no W^O; dropout acts on the embeddings and the attention weights only."""
    ref = dict(pad_logit="zero", embedding_init="xavier", attention_output=False, residual_dropout=False,
               layer_norm_epsilon=1e-8)
    keras.utils.set_random_seed(0)
    hp = hyperparams.Hparams(d_model=64, d_ff=64, num_blocks=1, num_heads=4, dropout_rate=0.3, **ref)
    m = transformer.make_model(hp, vocab_size=3000)
    x, d, _ = batch_of_two()
    logits = ops.convert_to_numpy(m((x, d)))
    assert np.all(logits[..., PAD] == 0.0) and np.all(logits[..., 4:] != 0.0)
    e = ops.convert_to_numpy(m.embedding.embeddings)
    limit = (6 / (3000 + 64)) ** 0.5  # Glorot uniform: U(-limit, limit), std limit / sqrt(3), 0.025 here
    assert np.abs(e).max() <= limit and np.abs(e).max() > 0.99 * limit
    assert e.std() == pytest.approx(limit / 3 ** 0.5, rel=0.02)
    assert not any("output" in v.path for v in m.weights)
    block = m.encoder_blocks[0]
    assert block.self_attention.dropout.rate == 0.3 and block.self_attention_norm.dropout.rate == 0.0
    assert block.self_attention_norm.norm.epsilon == 1e-8
    # the paper's (this port's default) choices, for contrast
    plain = transformer.make_model(dataclasses.replace(hp, **{f: getattr(hyperparams.Hparams(), f) for f in ref}), 3000)
    assert np.all(ops.convert_to_numpy(plain((x, d)))[..., PAD] != 0.0)
    assert ops.convert_to_numpy(plain.embedding.embeddings).std() == pytest.approx(64 ** -0.5, rel=0.02)
    assert plain.encoder_blocks[0].self_attention_norm.dropout.rate == 0.3
    # the <pad> row still learns nothing through the logits under the reference's setting
    transformer.compile_model(m, hp)
    before = ops.convert_to_numpy(m.embedding.embeddings)[PAD].copy()
    m.train_on_batch((x, d), batch_of_two()[2])
    np.testing.assert_array_equal(ops.convert_to_numpy(m.embedding.embeddings)[PAD], before)


def test_attention_dropout_sets_the_attention_weights_rate_alone_and_survives_saving(tmp_path):
    """--attention_dropout: its own rate on the attention weights of every block (self and cross);
    embeddings and sublayer outputs keep --dropout_rate; -1 (the default) means dropout_rate there too."""
    hp = hyperparams.Hparams(d_model=32, d_ff=64, num_blocks=1, num_heads=4, dropout_rate=0.2, attention_dropout=0.0)
    m = transformer.make_model(hp, vocab_size=300)
    enc, dec = m.encoder_blocks[0], m.decoder_blocks[0]
    assert [a.dropout.rate for a in (enc.self_attention, dec.self_attention, dec.cross_attention)] == [0.0] * 3
    assert enc.self_attention_norm.dropout.rate == 0.2 and dec.feed_forward_norm.dropout.rate == 0.2
    assert m.source_dropout.rate == 0.2
    path = str(tmp_path / "m.keras")
    m.save(path)
    loaded = keras.models.load_model(path, compile=False)
    assert loaded.decoder_blocks[0].cross_attention.dropout.rate == 0.0
    assert loaded.decoder_blocks[0].feed_forward_norm.dropout.rate == 0.2
    same = transformer.make_model(dataclasses.replace(hp, attention_dropout=-1.0), vocab_size=300)
    assert same.decoder_blocks[0].cross_attention.dropout.rate == 0.2
    with pytest.raises(UserError, match="attention_dropout"):
        hyperparams.validate(dataclasses.replace(hp, attention_dropout=1.5))


def batch_of_two():
    x = np.array([[5, 6, 7, EOS], [8, EOS, PAD, PAD]])
    d = np.array([[BOS, 9, 10, 12], [BOS, 11, PAD, PAD]])
    y = np.array([[9, 10, 12, EOS], [11, EOS, PAD, PAD]])
    return x, d, y


def numpy_smoothed_loss(logits, labels, epsilon):
    """Mean over real tokens of the cross-entropy against (1 - eps) one-hot + eps / V (section 5.4)."""
    logits = logits.astype(np.float64)
    log_p = logits - logits.max(-1, keepdims=True)
    log_p -= np.log(np.exp(log_p).sum(-1, keepdims=True))
    target = (1 - epsilon) * np.eye(logits.shape[-1])[labels] + epsilon / logits.shape[-1]
    per_token = -(target * log_p).sum(-1)
    return per_token[labels != PAD].mean()


@pytest.mark.jax
@pytest.mark.parametrize("smoothing, beta_2, epsilon, decay", [(0.0, 0.98, 1e-9, 0.0), (0.3, 0.999, 1e-8, 0.05)])
def test_compile_model_wires_the_smoothing_and_adams_constants(smoothing, beta_2, epsilon, decay):
    """The compiled loss is the smoothed cross-entropy with hp.smoothing (the reference's
    --smoothing never reached its loss: it was always 0.1), and three updates of the compiled
    optimizer follow Adam with beta1 0.9, hp.adam_beta2 and hp.adam_epsilon (0.98 and 1e-9 in
    section 5.3; 0.999 and 1e-8 in the reference) and the warmup schedule. Gradients of 1e-8 on one
    weight make eps count; gradients that change from step to step make the betas count. With
    hp.weight_decay each weight first shrinks by decay x lr (decoupled, as AdamW)."""
    keras.utils.set_random_seed(0)
    m, hp = tiny(smoothing=smoothing, lr=2e-3, warmup_steps=2, adam_beta2=beta_2, adam_epsilon=epsilon,
                 weight_decay=decay)
    transformer.compile_model(m, hp)
    x, d, y = batch_of_two()
    logits = m((x, d))
    loss = float(m.compute_loss(x=(x, d), y=y, y_pred=logits, training=False))
    assert loss == pytest.approx(numpy_smoothed_loss(ops.convert_to_numpy(logits), y, smoothing), rel=1e-5)

    variables = m.trainable_variables[:3]
    rng = np.random.default_rng(1)
    w = [ops.convert_to_numpy(v).astype(np.float64) for v in variables]
    moments = [(np.zeros_like(a), np.zeros_like(a)) for a in w]
    for t in range(1, 4):
        grads = [rng.standard_normal(a.shape) * (1e-8 if i == 0 else t) for i, a in enumerate(w)]
        m.optimizer.apply([ops.convert_to_tensor(g, "float32") for g in grads], variables)
        lr = hp.lr * min(t / hp.warmup_steps, (hp.warmup_steps / t) ** 0.5)
        for i, g in enumerate(grads):
            first, second = moments[i]
            first = 0.9 * first + 0.1 * g
            second = beta_2 * second + (1 - beta_2) * g * g
            moments[i] = (first, second)
            step = lr * np.sqrt(1 - beta_2 ** t) / (1 - 0.9 ** t) * first / (np.sqrt(second) + epsilon)
            w[i] = w[i] * (1 - decay * lr) - step
    for v, want in zip(variables, w):
        np.testing.assert_allclose(ops.convert_to_numpy(v), want, rtol=2e-5, atol=1e-7, err_msg=v.path)


@pytest.mark.slow
@pytest.mark.jax
def test_learned_positions_save_load_and_decode_from_the_right_offsets(tmp_path):
    """The reference's legacy learned positions: a saved model loads with them, and cached decoding
    reads row `step` of the table at every step (the uncached decoder reads rows 0..t at once)."""
    keras.utils.set_random_seed(3)
    m, hp = tiny(positional="learned", maxlen1=12, maxlen2=12)
    rng = np.random.default_rng(0)
    for layer in (m.source_position, m.target_position):  # N(0, 9): positions that change choices
        layer.table.assign(3 * rng.standard_normal(layer.table.shape).astype("float32"))
    x, d, _ = batch_of_two()
    path = str(tmp_path / "learned.keras")
    m.save(path)
    loaded = keras.models.load_model(path, compile=False)
    assert (loaded.positional, loaded.maxlen1, loaded.maxlen2) == ("learned", 12, 12)
    np.testing.assert_allclose(ops.convert_to_numpy(loaded((x, d))), ops.convert_to_numpy(m((x, d))), rtol=1e-5,
                               atol=1e-5)  # loaded with the plain parts
    src = rng.integers(4, 14, (5, 7)).astype(np.int32)
    cached, cached_scores = decoding.greedy_decode(loaded, src, max_len=10, min_len=10, return_scores=True)
    uncached, uncached_scores = decoding.greedy_decode(loaded, src, max_len=10, min_len=10, cached=False,
                                                       return_scores=True)
    np.testing.assert_array_equal(cached, uncached)
    np.testing.assert_allclose(cached_scores, uncached_scores, rtol=1e-4)
    assert sum(len(set(row)) > 1 for row in cached) >= 3  # the choice changes along most outputs


def test_mixed_bfloat16_forward_and_loss_stay_near_float32():
    """The same weights under mixed_bfloat16 and float32. bfloat16 keeps 8 significant bits, so its
    matmuls round to about 0.2% a product; the positions, softmaxes, layer norms and the loss run
    in float32. Measured here: loss within 0.1%, logit errors of 1% (mean) and 6% (max) of the
    logits' spread. Allowed: 1%, 3% and 25%. Targets of 300 tokens: positions past 256 are not
    whole numbers in bfloat16, and an encoding computed from them errs by half the spread."""
    rng = np.random.default_rng(0)
    x = rng.integers(4, 14, (8, 12)).astype(np.int32)
    x[:4, 8:] = PAD
    y = rng.integers(4, 14, (8, 300)).astype(np.int32)
    y[:3, 200:] = PAD
    d = np.concatenate([np.full((8, 1), BOS), y[:, :-1]], axis=1)
    outputs, weights = {}, None
    for policy in ("float32", "mixed_bfloat16"):
        keras.mixed_precision.set_global_policy(policy)
        try:
            keras.utils.set_random_seed(0)
            m, hp = tiny(smoothing=0.1)
            transformer.compile_model(m, hp)
            weights = m.get_weights() if weights is None else weights
            m.set_weights(weights)
            logits = m((x, d))
            loss = float(m.compute_loss(x=(x, d), y=y, y_pred=logits, training=False))
            outputs[policy] = (ops.convert_to_numpy(ops.cast(logits, "float32")), loss)
        finally:
            keras.mixed_precision.set_global_policy("float32")
    (full, full_loss), (mixed, mixed_loss) = outputs["float32"], outputs["mixed_bfloat16"]
    real = y != PAD
    error, spread = np.abs(mixed - full)[real], full[real].std()
    assert abs(mixed_loss - full_loss) <= 0.01 * full_loss, (mixed_loss, full_loss)
    assert error.mean() <= 0.03 * spread and error.max() <= 0.25 * spread, (error.mean() / spread, error.max() / spread)


@pytest.mark.skipif(keras.backend.backend() != "tensorflow",
                    reason="SkipNonfinite is TensorFlow-only: train.py refuses --skip_nonfinite on other backends")
def test_skip_nonfinite_leaves_out_nonfinite_batches_exactly():
    """Training on [b1, bad, b2] with the guard ends where training on [b1, b2] ends."""
    base = keras.optimizers.Adam
    x = np.random.default_rng(1).standard_normal((3, 8, 4)).astype("float32")
    y = np.random.default_rng(2).standard_normal((3, 8, 1)).astype("float32")
    x[1, 0, 0] = np.inf  # a batch whose loss and gradients are not finite

    def run(batches, optimizer):
        keras.utils.set_random_seed(0)
        net = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        net.compile(optimizer=optimizer, loss="mse")
        for i in batches:
            loss = net.train_on_batch(x[i], y[i])
        return net.get_weights(), optimizer, loss

    guarded, opt, _ = run([0, 1, 2], transformer.GuardedAdam(learning_rate=0.1))
    plain, _, _ = run([0, 2], base(learning_rate=0.1))
    for a, b in zip(guarded, plain):
        np.testing.assert_array_equal(a, b)
    assert int(ops.convert_to_numpy(opt.iterations)) == 2 and int(ops.convert_to_numpy(opt.skipped_steps)) == 1
    broken, _, loss = run([0, 1], base(learning_rate=0.1))
    assert not np.isfinite(loss) and not np.isfinite(broken[0]).all()  # what the guard prevents


def test_the_loss_is_the_mean_over_every_target_token():
    """loss_per_token over uneven batches equals the loss of one batch holding every pair; the plain
    mean of the batch means (a short batch weighing like a full one) does not."""
    keras.utils.set_random_seed(0)
    hp = hyperparams.Hparams(d_model=16, d_ff=32, num_blocks=1, num_heads=2, dropout_rate=0.0)
    m = transformer.compile_model(transformer.make_model(hp, vocab_size=14), hp)
    x, d, y = copy_batches()(40)
    y[30:, 2:] = PAD  # the last, small batch holds short targets only
    d[30:, 2:] = PAD
    batches = [((x[:30], d[:30]), y[:30]), ((x[30:], d[30:]), y[30:])]
    whole = transformer.loss_per_token(m, [((x, d), y)])
    assert transformer.loss_per_token(m, batches) == pytest.approx(whole, rel=1e-5)
    means = np.mean([float(m.test_on_batch(b, t)) for b, t in batches])
    assert abs(means - whole) > 1e-3


def test_the_loss_alone_needs_no_learning_rate_schedule():
    """eval.py's compile_for_loss: the loss of compile_model, for a run with --lr_decay linear too
    (whose schedule needs the run's number of steps, known only to training), and nan for a split
    with no pair within maxlen."""
    keras.utils.set_random_seed(0)
    hp = hyperparams.Hparams(d_model=16, d_ff=32, num_blocks=1, num_heads=2, dropout_rate=0.0, lr_decay="linear")
    m = transformer.make_model(hp, vocab_size=14)
    with pytest.raises(ValueError, match="needs the number of training steps"):
        transformer.compile_model(m, hp)
    x, d, y = copy_batches()(8)
    alone = transformer.loss_per_token(transformer.compile_for_loss(m, hp), [((x, d), y)])
    trained = transformer.loss_per_token(transformer.compile_model(m, hp, total_steps=10), [((x, d), y)])
    assert alone == pytest.approx(trained, rel=1e-6)
    assert np.isnan(transformer.loss_per_token(m, []))


@pytest.mark.skipif(keras.backend.backend() != "tensorflow",
                    reason="SkipNonfinite is TensorFlow-only: train.py refuses --skip_nonfinite on other backends")
def test_the_guarded_optimizer_saves_and_loads_the_plain_layout(tmp_path):
    """Adam's state moves between GuardedAdam and Adam both ways (--skip_nonfinite changed on a
    resume), and a GuardedAdam checkpoint of the older layout (its count last) still loads."""
    from trained import checkpoints

    keras.utils.set_random_seed(0)
    x, d, y = copy_batches()(16)

    def trained(skip, steps=3):
        hp = hyperparams.Hparams(d_model=16, d_ff=32, num_blocks=1, num_heads=2, skip_nonfinite=skip,
                                 kernels="plain", output_vocab="all")
        m = transformer.compile_model(transformer.make_model(hp, vocab_size=14), hp)
        for _ in range(steps):
            m.train_on_batch((x, d), y)
        return m, hp

    for saved_with, loaded_with in ((True, False), (False, True), (True, True)):
        m, _ = trained(saved_with)
        path = str(tmp_path / f"{saved_with}.keras")
        m.save(path)
        fresh, hp = trained(loaded_with, steps=0)
        fresh.load_weights(path)
        assert int(ops.convert_to_numpy(fresh.optimizer.iterations)) == 3
        state = [np.asarray(v) for v in m.optimizer.variables if v is not getattr(m.optimizer, "skipped_steps", None)]
        loaded = [np.asarray(v) for v in fresh.optimizer.variables
                  if v is not getattr(fresh.optimizer, "skipped_steps", None)]
        assert all(np.array_equal(a, b) for a, b in zip(state, loaded)) and len(state) == len(loaded)
    # the layout before: every variable, the count last
    m, _ = trained(True)
    m.optimizer.skipped_steps.assign(2)
    old = str(tmp_path / "old.keras")
    save = transformer.SkipNonfinite.save_own_variables
    try:
        transformer.SkipNonfinite.save_own_variables = keras.optimizers.Adam.save_own_variables
        m.save(old)
    finally:
        transformer.SkipNonfinite.save_own_variables = save
    fresh, hp = trained(True, steps=0)
    fresh.load_weights(old)
    assert int(ops.convert_to_numpy(fresh.optimizer.skipped_steps)) == 2
    assert int(ops.convert_to_numpy(fresh.optimizer.iterations)) == 3
    # loaded into plain Adam, that layout cannot be: restoring refuses it instead of starting anew
    state = {"epoch": 1, "batch": 0, "step": 3}
    plain = dataclasses.replace(hp, skip_nonfinite=False)
    with pytest.raises(UserError, match="its optimizer state \\(step 3\\) does not load"):
        checkpoints.restore(old, state, plain)

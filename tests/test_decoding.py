"""Cached incremental decoding and beam search."""
import keras
import numpy as np
import pytest
from keras import ops

import decoding
import hyperparams
import model as transformer
import modules
from conftest import add_a_stack_residual, add_another_residual, bar_a_column
from data_load import BOS, EOS, PAD


@pytest.mark.jax
def test_cached_and_uncached_decoding_give_the_same_tokens(copy_model):
    m, batch = copy_model
    x, _, _ = batch(50)
    np.testing.assert_array_equal(decoding.greedy_decode(m, x, cached=True), decoding.greedy_decode(m, x, cached=False))
    # untrained models, forced to 12 tokens: every step's cached state matters. Their weights
    # favour no token, <pad> and <s> among them: decoding must never choose those. One model is
    # decoded with each seed's weights in turn, so its compiled decoders serve all three.
    hp = hyperparams.Hparams(d_model=32, d_ff=64, num_blocks=2, num_heads=4)
    fresh = transformer.make_model(hp, 30)
    for seed in (1, 3, 5):
        keras.utils.set_random_seed(seed)
        fresh.set_weights(transformer.make_model(hp, 30).get_weights())
        src = np.random.default_rng(seed).integers(4, 30, (6, 9)).astype(np.int32)
        a, sa = decoding.greedy_decode(fresh, src, max_len=12, min_len=12, cached=True, return_scores=True)
        b, sb = decoding.greedy_decode(fresh, src, max_len=12, min_len=12, cached=False, return_scores=True)
        np.testing.assert_array_equal(a, b)
        np.testing.assert_allclose(sa, sb, rtol=1e-4)
        assert a.shape == (6, 12) and not np.isin(a, [PAD, BOS]).any()
        beam = decoding.beam_search(fresh, src, beam_size=3, max_len=12, min_len=12)
        assert beam.shape == (6, 12) and not np.isin(beam, [PAD, BOS]).any()


def test_greedy_choice_never_picks_pad_or_bos_and_eos_only_when_allowed(copy_model):
    """The best column not barred, and its log-probability under the softmax over every column
    (the barred ones included), however many of the best logits are barred."""
    m, _ = copy_model
    logits = np.full((2, m.output_size), -9.0, np.float32)
    logits[:, [PAD, BOS, EOS, 5, 6]] = [[4.1, 4.2, 4.3, 4.4, 2.0], [4.4, 4.3, 4.2, 1.0, 1.5]]
    log_probs = logits - np.log(np.exp(logits.astype(np.float64)).sum(1, keepdims=True))
    for allow_eos, want in ((False, [5, 6]), (True, [5, EOS])):
        ids, chosen = decoding.greedy_choice(m, ops.convert_to_tensor(logits), ops.convert_to_tensor(allow_eos))
        assert ops.convert_to_numpy(ids).tolist() == want
        np.testing.assert_allclose(ops.convert_to_numpy(chosen), log_probs[[0, 1], want], rtol=1e-6)


def test_beam_size_one_is_greedy(copy_model, kernels):
    m, batch = transformer.rebuild(copy_model[0], kernels), copy_model[1]
    x, _, _ = batch(50)
    greedy, g_scores = decoding.greedy_decode(m, x, return_scores=True)
    beam, b_scores = decoding.beam_search(m, x, beam_size=1, alpha=0.0, return_scores=True)
    width = max(greedy.shape[1], beam.shape[1])
    pad = lambda a: np.pad(a, ((0, 0), (0, width - a.shape[1])))
    np.testing.assert_array_equal(pad(greedy), pad(beam))
    np.testing.assert_allclose(g_scores, b_scores, rtol=1e-4)


@pytest.mark.jax
def test_a_beam_of_one_chooses_greedys_token_where_the_score_would_round_a_near_tie_into_one():
    """beam_step with one beam whose score (-400) is large beside the gap between its two best
    tokens' logits, and so log-probabilities (1e-5, below float32's spacing of 3e-5 at 400): it
    extends with the better one, the later column, as greedy decoding's argmax does; summed first,
    the two would tie and the earlier column win."""
    import types

    vocab = 12
    model = types.SimpleNamespace(output_size=vocab, to_ids=lambda columns: columns, parts=modules.PLAIN)
    logits = np.full((1, vocab), -20.0, np.float32)
    logits[0, 5], logits[0, 7] = -1.00001, -1.0
    state = decoding.beam_start(1, 1, 4)
    state["alive_scores"] = ops.convert_to_tensor(np.array([[-400.0]], np.float32))
    _, _, tokens = decoding.beam_step(model, 1, ops.convert_to_tensor(logits), 0, 4, 1, 0.0, state)
    assert ops.convert_to_numpy(tokens).tolist() == [7]
    assert np.float32(-400.0) + np.float32(-1.00001) == np.float32(-400.0) + np.float32(-1.0)  # the tie summing makes


@pytest.mark.slow
def test_beam_search_score_is_never_below_greedy(copy_model, kernels):
    m, batch = transformer.rebuild(copy_model[0], kernels), copy_model[1]
    x, _, _ = batch(100)
    _, g_scores = decoding.greedy_decode(m, x, return_scores=True)
    _, b_scores = decoding.beam_search(m, x, beam_size=4, alpha=0.0, return_scores=True)
    assert (b_scores >= g_scores - 1e-4).all()


def test_beam_search_stops_at_eos_and_pads_after(copy_model):
    m, batch = copy_model
    x, _, y = batch(30)
    out = decoding.beam_search(m, x, beam_size=3, alpha=0.6)
    for row in out:
        assert EOS in row
        assert (row[list(row).index(EOS) + 1:] == PAD).all()
    assert out.shape[1] <= 8 + 1  # it stopped long before max_len (1.5 * 8 + 10)


def rescore(m, source, ids):
    """Each output's log-probability under the model by teacher forcing: the sum over its tokens up to
    and including </s> of log softmax(logits) at the token. source (N, T1), ids (N, L) -> (N,)."""
    ids = np.asarray(ids)
    target_in = np.concatenate([np.full((len(ids), 1), BOS), ids[:, :-1]], axis=1)  # (N, L)
    logits = ops.convert_to_numpy(m((np.asarray(source), target_in), training=False)).astype(np.float64)
    columns = ids if m.output_ids is None else np.searchsorted(m.output_ids, ids)  # ids -> logits columns
    log_p = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) \
        - logits.max(-1, keepdims=True)  # (N, L, V')
    chosen = np.take_along_axis(log_p, columns[..., None], axis=-1)[..., 0]  # (N, L)
    return (chosen * (ids != PAD)).sum(-1)


def gnmt_penalty(length, alpha):
    return ((5.0 + length) / 6.0) ** alpha


@pytest.mark.slow
@pytest.mark.jax
def test_beam_search_returns_the_best_hypothesis_of_an_exhaustive_search(kernels):
    """A model over 6 ids, of which <unk>, </s>, 4 and 5 can be chosen (<pad> and <s> never), and
    outputs of at most 3 tokens: 1 + 3 + 9 = 13 hypotheses end in </s>. At most 9 prefixes are open
    at a step, 36 candidates: a beam of 64 keeps all of them, so beam search is exhaustive here and
    must return the hypothesis with the best log-probability / GNMT penalty, and its log-probability,
    as scored by the model itself (teacher forcing) for every hypothesis."""
    import itertools

    keras.utils.set_random_seed(2)
    hp = hyperparams.Hparams(d_model=16, d_ff=32, num_blocks=2, num_heads=2, dropout_rate=0.0, kernels=kernels)
    m = transformer.make_model(hp, 6)
    # 5x the embeddings (and so the logits): sharper choices than an untrained model's, so that
    # the length penalty changes the winner
    m.embedding.embeddings.assign(ops.convert_to_numpy(m.embedding.embeddings) * 5.0)
    source = np.array([[4, 5, 5, EOS], [5, 4, EOS, PAD], [4, 4, 4, EOS], [5, EOS, PAD, PAD],
                       [5, 5, 4, EOS], [4, EOS, PAD, PAD]], np.int32)
    hypotheses = [list(prefix) + [EOS] for length in range(3)
                  for prefix in itertools.product([1, 4, 5], repeat=length)]
    padded = np.array([h + [PAD] * (3 - len(h)) for h in hypotheses], np.int32)  # (13, 3)
    scores = np.stack([rescore(m, np.repeat(s[None], len(padded), 0), padded) for s in source])  # (6, 13)
    lengths = np.array([len(h) for h in hypotheses])
    best = {}
    for alpha in (0.0, 1.0, 3.0):
        normalized = scores / gnmt_penalty(lengths, alpha)  # (6, 13)
        order = np.sort(normalized, axis=1)
        assert (order[:, -1] - order[:, -2] > 1e-4).all()  # no near-ties: the best is well defined
        best[alpha] = normalized.argmax(1)
        ids, got = decoding.beam_search(m, source, beam_size=64, alpha=alpha, max_len=3, return_scores=True)
        ids = np.pad(ids, ((0, 0), (0, 3 - ids.shape[1])))
        np.testing.assert_array_equal(ids, padded[best[alpha]], err_msg=f"alpha {alpha}")
        np.testing.assert_allclose(got, scores[np.arange(6), best[alpha]], rtol=1e-5, atol=1e-5)
    # the length penalty changes the answer, for some sentences
    assert (best[0.0] != best[1.0]).any() and (best[1.0] != best[3.0]).any()


def test_attention_that_reads_the_cache_index_as_a_position_fails_the_in_place_beam(monkeypatch):
    """The cache index attention gets is an entry, not a position: beam search's in-place layout
    writes hypothesis k of step t at t*K + k. A learner who makes attention position-aware by
    reading it as the query's position (here: queries and keys scaled by 1 + position / 10) gets
    a model whose beam scores, with the reordering cache, are its own teacher-forced scores, and
    with the in-place one are not: the check the tests above make (beam scores = the model's own
    scores, with both kernels) fails loudly instead of the model decoding wrong in silence."""
    import modules

    class PositionScaledAttention(modules.MultiHeadAttention):
        def call(self, query, memory, attention_mask=None, causal=False, cache=None, cache_index=None,
                 training=None, return_attention_scores=False):
            if memory is query:  # self-attention: positions from the cache index (wrong in general)
                start = 0 if cache_index is None else cache_index
                position = ops.cast(ops.arange(ops.shape(query)[1]) + start, query.dtype)  # (Tq,)
                query = memory = query * (1.0 + 0.1 * ops.reshape(position, (1, -1, 1)))  # (N, Tq, d)
            return super().call(query, memory, attention_mask, causal, cache, cache_index, training,
                                return_attention_scores)

    monkeypatch.setattr(modules, "MultiHeadAttention", PositionScaledAttention)
    keras.utils.set_random_seed(5)
    hp = hyperparams.Hparams(d_model=16, d_ff=32, num_blocks=2, num_heads=2, dropout_rate=0.0, kernels="plain")
    m = transformer.make_model(hp, 12)
    assert isinstance(m.decoder_blocks[0].self_attention, PositionScaledAttention)
    source = np.random.default_rng(5).integers(4, 12, (4, 6)).astype(np.int32)
    source[:, -1] = EOS
    gaps = {}
    for kernels in ("plain", "beam_cache"):
        layout = transformer.rebuild(m, kernels)
        ids, scores = decoding.beam_search(layout, source, beam_size=3, alpha=0.6, max_len=8, min_len=8,
                                           return_scores=True)
        gaps[kernels] = np.abs(scores - rescore(layout, source, ids)).max()
    assert gaps["plain"] < 1e-4 and gaps["beam_cache"] > 1e-2, gaps


@pytest.mark.slow
def test_beam_scores_are_the_model_score_of_the_returned_outputs(copy_model, kernels):
    """At ordinary beam sizes, on a trained model, each returned log-probability is the model's own
    score of the returned ids (a score of another hypothesis, or a cache read from the wrong
    ancestor, would differ)."""
    m = transformer.rebuild(copy_model[0], kernels)
    rng = np.random.default_rng(4)
    x = np.zeros((40, 16), np.int32)  # longer than any training input: a less certain model
    for row, length in zip(x, rng.integers(7, 13, len(x))):
        row[:length + 1] = np.append(rng.integers(4, 14, length), EOS)
    for beam_size, alpha in ((2, 0.6), (4, 0.6), (5, 1.0)):
        ids, scores = decoding.beam_search(m, x, beam_size=beam_size, alpha=alpha, return_scores=True)
        np.testing.assert_allclose(scores, rescore(m, x, ids), rtol=1e-4, atol=1e-4,
                                   err_msg=f"beam {beam_size}")
        assert (scores < -0.1).sum() >= 5  # some outputs the model is unsure of


@pytest.mark.slow
@pytest.mark.jax
@pytest.mark.parametrize("edit", ["a block's call", "the model's decoder pass", "the model's output layer"])
def test_a_changed_decoder_reaches_every_decoding_path(copy_model, monkeypatch, edit):
    """A learner's edit to the decoder reaches every way of decoding, with the plain and the fast
    kernels: to DecoderBlock.call (another residual: the block's input added to its output once
    more), to the model's own pass over the blocks (Transformer.decoder_stack: the same around the
    whole stack) or to its output layer (Transformer.logits: one column barred). Cached greedy
    decoding returns what the reference's uncached decoding returns, token for token; beam search
    of width 1 is that greedy decoding; beam search of width 4 returns the same ids with either
    kernels (the in-place cache layout with the fast ones), each scored as the changed model scores
    it (teacher forcing)."""
    x, _, _ = copy_model[1](40)
    unchanged = decoding.greedy_decode(transformer.rebuild(copy_model[0], "plain"), x)
    if edit == "a block's call":
        add_another_residual(monkeypatch)
    elif edit == "the model's decoder pass":
        add_a_stack_residual(monkeypatch)
    else:
        ids, counts = np.unique(unchanged[unchanged > EOS], return_counts=True)
        token, output_ids = int(ids[np.argmax(counts)]), copy_model[0].output_ids  # the token chosen most often
        bar_a_column(monkeypatch, token if output_ids is None else output_ids.index(token))
    plain, fast = (transformer.rebuild(copy_model[0], kernels) for kernels in ("plain", "fast"))
    models = [plain, fast]
    if keras.backend.backend() == "tensorflow":  # the loops compiled by XLA, and as one graph
        models.append(transformer.rebuild(fast, xla_decoding=not fast.xla_decoding))
    want = decoding.greedy_decode(plain, x, cached=False)
    assert want.shape != unchanged.shape or (want != unchanged).any()  # the edit changes translations
    beams = []
    for m in models:
        np.testing.assert_array_equal(decoding.greedy_decode(m, x), want)
        one = decoding.beam_search(m, x, beam_size=1, alpha=0.0)
        np.testing.assert_array_equal(one[:, :want.shape[1]], want)
        ids, scores = decoding.beam_search(m, x, beam_size=4, alpha=0.6, return_scores=True)
        np.testing.assert_allclose(scores, rescore(m, x, ids), rtol=1e-4, atol=1e-4)
        beams.append(ids)
    for ids in beams[1:]:
        np.testing.assert_array_equal(beams[0], ids)


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="XLA or one graph: TensorFlow's choice")
def test_one_graph_is_traced_once_for_every_batch_shape_and_decodes_as_xla_does(copy_model):
    """With --jit_compile off the decoding loops run as one TensorFlow graph: batches of three
    shapes (rows, source length, so output lengths too) are decoded by a graph traced once for
    each search, and to the same ids and scores as the loops XLA compiles for each shape."""
    x, _, _ = copy_model[1](40)  # (40, T1)
    batches = [x[:40], x[:24, :-3], x[:9, :-6]]  # three shapes
    graph, xla = (transformer.rebuild(copy_model[0], "fast", xla_decoding=on) for on in (False, True))
    for search in (lambda m, b: decoding.greedy_decode(m, b, return_scores=True),
                   lambda m, b: decoding.beam_search(m, b, beam_size=3, alpha=0.6, return_scores=True)):
        for batch in batches:
            (ids, scores), (want, want_scores) = search(graph, batch), search(xla, batch)
            np.testing.assert_array_equal(ids, want)
            np.testing.assert_allclose(scores, want_scores, rtol=1e-4, atol=1e-4)
    for loop in (decoding.greedy_loop, decoding.beam_loop):
        traced = decoding.compiled(graph, loop).graphs  # one graph for each value of the beam's settings
        assert [f.experimental_get_tracing_count() for f in traced.values()] == [1], loop.__name__
        # no op that XLA would compile on its own for each shape (the loops' bodies included)
        graph_def = next(iter(traced.values())).get_concrete_function().graph.as_graph_def()
        ops_used = {n.op for n in graph_def.node} | {n.op for f in graph_def.library.function for n in f.node_def}
        assert not [op for op in ops_used if op.startswith("Xla")], loop.__name__
    assert not hasattr(decoding.compiled(xla, decoding.greedy_loop), "graphs")


def test_set_aside_keeps_the_open_sentences_and_writes_out_the_others():
    """Once some sentences are done, a loop keeps the open ones' rows alone, in order: the done
    ones' results go to the outputs at their rows in the batch, and every live tensor keeps the
    kept sentences' rows (R adjacent rows a sentence for hypothesis rows). With none done, nothing
    moves; with all done, one row stays."""
    n, length = 5, 3
    rows = np.array([4, 0, 2, 1, 3], np.int32)  # each live sentence's row in the batch
    ids = np.arange(n * length, dtype=np.int32).reshape(n, length) + 1  # (n, L)
    scores = -np.arange(1, n + 1, dtype=np.float32)  # (n,)
    hypotheses = np.arange(2 * n, dtype=np.int32)  # (n*2,) two rows a sentence

    def set_aside(done, count):
        live = [({"ids": ops.convert_to_tensor(ids[:count])}, 1), (ops.convert_to_tensor(hypotheses[:2 * count]), 2)]
        aside = ops.convert_to_tensor(rows[:count]), decoding.nothing_aside(n, length)[1]
        (kept, kept_hypotheses), (kept_rows, outputs) = decoding.set_aside(
            ops.convert_to_tensor(np.array(done)), live, aside,
            lambda: (ops.convert_to_tensor(ids[:count]), ops.convert_to_tensor(scores[:count])))
        return [ops.convert_to_numpy(x) for x in (kept_rows, kept["ids"], kept_hypotheses, *outputs)]

    # three open of five: their three rows kept, the two done ones written out
    kept_rows, kept_ids, kept_hypotheses, out_ids, out_scores = set_aside([False, True, False, True, False], n)
    np.testing.assert_array_equal(kept_rows, rows[[0, 2, 4]])
    np.testing.assert_array_equal(kept_ids, ids[[0, 2, 4]])
    np.testing.assert_array_equal(kept_hypotheses, [0, 1, 4, 5, 8, 9])
    want_ids, want_scores = np.zeros((n, length), np.int32), np.zeros(n, np.float32)
    for done in (1, 3):
        want_ids[rows[done]], want_scores[rows[done]] = ids[done], scores[done]
    np.testing.assert_array_equal(out_ids, want_ids)
    np.testing.assert_array_equal(out_scores, want_scores)
    # none done of four: all four rows stay
    kept_rows, kept_ids, kept_hypotheses, out_ids, _ = set_aside([False] * 4, 4)
    np.testing.assert_array_equal(kept_ids, ids[:4])
    np.testing.assert_array_equal(kept_hypotheses, hypotheses[:8])
    assert not out_ids.any()
    # all three done: the first stays (a loop's last step), the others written out
    kept_rows, kept_ids, _, out_ids, _ = set_aside([True] * 3, 3)
    np.testing.assert_array_equal(kept_ids, ids[:1])
    want_ids = np.zeros((n, length), np.int32)
    want_ids[rows[1]], want_ids[rows[2]] = ids[1], ids[2]
    np.testing.assert_array_equal(out_ids, want_ids)


def test_gather_beams_takes_each_sentences_rows_as_take_along_axis_does():
    """gather_beams (one gather over the first two axes as one) picks for each sentence the rows
    its indices name, as np.take_along_axis along axis 1 does, at ranks 2 to 4 and, on TensorFlow,
    in a graph that knows none of the lengths."""
    rng = np.random.default_rng(0)
    beams = rng.integers(0, 5, (3, 4)).astype(np.int32)  # (N, J) rows among K' = 5
    for shape in ((3, 5), (3, 5, 7), (3, 5, 2, 6)):
        x = rng.standard_normal(shape).astype(np.float32)
        index = beams.reshape(beams.shape + (1,) * (len(shape) - 2))
        want = np.take_along_axis(x, index, axis=1)  # (N, J, ...)
        np.testing.assert_array_equal(ops.convert_to_numpy(decoding.gather_beams(x, beams)), want)
        if keras.backend.backend() == "tensorflow":
            import tensorflow as tf

            unknown = tf.function(decoding.gather_beams, input_signature=[
                tf.TensorSpec((None,) * len(shape), tf.float32), tf.TensorSpec((None, None), tf.int32)])
            np.testing.assert_array_equal(unknown(x, beams).numpy(), want)


def test_the_output_length_rule_is_one_for_ints_and_traced_lengths():
    """default_max_len gives 1.5 T1 + 10, T1 padded as loops compiled for each shape pad it (to a
    multiple of 8, not past maxlen1 when it fits), clamped to a learned position table, for a
    Python int and for a length tensor (trained/serving.py's SavedModel computes it in its graph) alike."""
    import types
    sinusoid = types.SimpleNamespace(positional="sinusoid", maxlen1=20)
    learned = types.SimpleNamespace(positional="learned", maxlen1=20, maxlen2=30)
    for model, length, want in ((sinusoid, 13, 34), (sinusoid, 16, 34), (sinusoid, 19, 40), (sinusoid, 21, 46),
                                (learned, 8, 22), (learned, 16, 30)):
        assert decoding.default_max_len(model, length) == want
        assert int(ops.convert_to_numpy(decoding.default_max_len(model, ops.convert_to_tensor(length)))) == want


def test_the_retracing_warning_of_a_decoding_loop_is_filtered_and_no_other(copy_model):
    """Each batch shape compiles the decoding loops once, on purpose: TensorFlow's warning about it
    (printed by eval.py over length-sorted batches) is left out; a retraced training step still warns."""
    import logging

    decoding.compiled(copy_model[0], decoding.beam_loop, static=("max_len", "beam_size", "alpha"))

    def kept(function):
        message = (f"5 out of the last 22 calls to functools.partial(<function {function} at 0x7f0c>, "
                   f"<Transformer name=transformer, built=True>) triggered tf.function retracing.")
        return decoding.expected_retracing(logging.LogRecord("tensorflow", logging.WARNING, "", 0, message, None,
                                                             None))

    assert not kept("beam_loop") and not kept("greedy_loop") and kept("train_step")
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf
        assert decoding.expected_retracing in tf.get_logger().filters


def test_ending_once_k_have_finished_keeps_greedy_and_never_beats_the_exact_rule(copy_model):
    """With stop "finished" a sentence ends once K hypotheses have ended (CTranslate2's and fairseq's
    rule): a beam of one still decodes as greedy decoding, and a beam of 4 returns a hypothesis that
    ends in </s>, scored as the model scores it, whose score over the penalty is never above the
    exact rule's ("bound"), which goes on from the same steps."""
    m, batch = copy_model
    x, _, _ = batch(50)
    greedy = decoding.greedy_decode(m, x)
    one = decoding.beam_search(m, x, beam_size=1, alpha=0.0, stop="finished")
    width = max(greedy.shape[1], one.shape[1])
    np.testing.assert_array_equal(np.pad(one, ((0, 0), (0, width - one.shape[1]))),
                                  np.pad(greedy, ((0, 0), (0, width - greedy.shape[1]))))
    normalized = {}
    for stop in ("bound", "finished"):
        ids, scores = decoding.beam_search(m, x, beam_size=4, alpha=1.0, return_scores=True, stop=stop)
        lengths = (ids != PAD).sum(1)
        assert (ids[np.arange(len(ids)), lengths - 1] == EOS).all(), stop
        np.testing.assert_allclose(scores, rescore(m, x, ids), rtol=1e-4, atol=1e-4, err_msg=stop)
        normalized[stop] = scores / gnmt_penalty(lengths, 1.0)
    assert (normalized["finished"] <= normalized["bound"] + 1e-5).all()

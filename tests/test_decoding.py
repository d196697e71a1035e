"""Cached incremental decoding and beam search."""
import keras
import numpy as np
from keras import ops

import hyperparams
import model as transformer
from data_load import BOS, EOS, PAD


def test_cached_and_uncached_decoding_give_the_same_tokens(copy_model):
    m, batch = copy_model
    x, _, _ = batch(50)
    np.testing.assert_array_equal(m.greedy_decode(x, cached=True), m.greedy_decode(x, cached=False))
    # untrained models, forced to 12 tokens: every step's cached state matters. Their weights
    # favour no token, <pad> and <s> among them: decoding must never choose those. One model is
    # decoded with each seed's weights in turn, so its compiled decoders serve all three.
    hp = hyperparams.Hparams(d_model=32, d_ff=64, num_blocks=2, num_heads=4)
    fresh = transformer.make_model(hp, 30)
    for seed in (1, 3, 5):
        keras.utils.set_random_seed(seed)
        fresh.set_weights(transformer.make_model(hp, 30).get_weights())
        src = np.random.default_rng(seed).integers(4, 30, (6, 9)).astype(np.int32)
        a, sa = fresh.greedy_decode(src, max_len=12, min_len=12, cached=True, return_scores=True)
        b, sb = fresh.greedy_decode(src, max_len=12, min_len=12, cached=False, return_scores=True)
        np.testing.assert_array_equal(a, b)
        np.testing.assert_allclose(sa, sb, rtol=1e-4)
        assert a.shape == (6, 12) and not np.isin(a, [PAD, BOS]).any()
        beam = fresh.beam_search(src, beam_size=3, max_len=12, min_len=12)
        assert beam.shape == (6, 12) and not np.isin(beam, [PAD, BOS]).any()


def test_greedy_choice_never_picks_pad_or_bos_and_eos_only_when_allowed(copy_model):
    m, _ = copy_model
    log_probs = np.full((1, m.output_size), -9.0, np.float32)
    log_probs[0, [PAD, BOS, EOS, 5]] = [-0.1, -0.2, -0.3, -0.4]
    for allow_eos, want in ((False, 5), (True, EOS)):
        ids, chosen = m.greedy_choice(ops.convert_to_tensor(log_probs), ops.convert_to_tensor(allow_eos))
        assert ops.convert_to_numpy(ids).tolist() == [want]
        np.testing.assert_allclose(ops.convert_to_numpy(chosen), log_probs[0, [want]])


def test_beam_size_one_is_greedy(copy_model):
    m, batch = copy_model
    x, _, _ = batch(50)
    greedy, g_scores = m.greedy_decode(x, return_scores=True)
    beam, b_scores = m.beam_search(x, beam_size=1, alpha=0.0, return_scores=True)
    width = max(greedy.shape[1], beam.shape[1])
    pad = lambda a: np.pad(a, ((0, 0), (0, width - a.shape[1])))
    np.testing.assert_array_equal(pad(greedy), pad(beam))
    np.testing.assert_allclose(g_scores, b_scores, rtol=1e-5)


def test_beam_search_score_is_never_below_greedy(copy_model):
    m, batch = copy_model
    x, _, _ = batch(100)
    _, g_scores = m.greedy_decode(x, return_scores=True)
    _, b_scores = m.beam_search(x, beam_size=4, alpha=0.0, return_scores=True)
    assert (b_scores >= g_scores - 1e-4).all()


def test_beam_search_stops_at_eos_and_pads_after(copy_model):
    m, batch = copy_model
    x, _, y = batch(30)
    out = m.beam_search(x, beam_size=3, alpha=0.6)
    for row in out:
        assert EOS in row
        assert (row[list(row).index(EOS) + 1:] == PAD).all()
    assert out.shape[1] <= 8 + 1  # it stopped long before max_len (1.5 * 8 + 10)


def test_top_k_by_blocks_equals_top_k_ties_included():
    from keras import ops

    from model import top_k_by_blocks
    rng = np.random.default_rng(0)
    for m, k in ((32000, 8), (7999, 8), (1000, 3), (50, 4)):
        x = rng.standard_normal((4, m)).astype("float32")
        x[0] = np.round(x[0])  # many ties: the lower column must come first, as in ops.top_k
        x[1, :200] = -np.inf
        got = [ops.convert_to_numpy(a) for a in top_k_by_blocks(ops.convert_to_tensor(x), k)]
        want = [ops.convert_to_numpy(a) for a in ops.top_k(ops.convert_to_tensor(x), k)]
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])

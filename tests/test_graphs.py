"""Decoding loops traced as one graph, kept across processes (support/graphs.py)."""
import os

import keras
import numpy as np
import pytest

import decoding
import model as transformer
from conftest import add_another_residual, bar_a_column
from support import graphs

pytestmark = pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="one graph: TensorFlow's")


def searches(m, x):
    """Greedy decoding and beam search of width 3 on x, with their scores."""
    return [decoding.greedy_decode(m, x, return_scores=True),
            decoding.beam_search(m, x, beam_size=3, alpha=0.6, return_scores=True)]


def read(m):
    """For each loop m has decoded with (greedy, beam), whether its graph was read from m.graph_folder."""
    return [decoding.compiled(m, loop).read for loop in (decoding.greedy_loop, decoding.beam_loop)]


def kept_files(folder):
    return {name: os.stat(folder / name).st_mtime_ns for name in os.listdir(folder)}


def assert_same(got, want):
    for (ids, scores), (want_ids, want_scores) in zip(got, want):
        np.testing.assert_array_equal(ids, want_ids)
        np.testing.assert_allclose(scores, want_scores, rtol=1e-5, atol=1e-5)


def test_a_kept_loop_is_read_by_another_model_and_decodes_with_its_weights(copy_model, tmp_path):
    """The first model to decode traces both loops and keeps them; a model built afresh with the
    same config reads them, traces nothing, and decodes as the first did; one with other weights
    reads them too, and decodes with its own weights (the graph reads the model's variables, it
    does not hold their values): as it does with no folder at all."""
    x, _, _ = copy_model[1](24)
    first = transformer.rebuild(copy_model[0], "fast", xla_decoding=False)
    first.graph_folder = str(tmp_path)
    want = searches(first, x)
    assert read(first) == [[False], [False]]
    files = kept_files(tmp_path)
    assert sorted(name.split("-")[0] for name in files) == ["beam_loop", "greedy_loop"]

    again = transformer.rebuild(first, "fast")  # the same config and weights, nothing traced yet
    assert_same(searches(again, x), want)
    assert read(again) == [[True], [True]]
    assert kept_files(tmp_path) == files  # nothing written anew

    other = transformer.rebuild(first, "fast")
    other.set_weights([w + np.random.default_rng(0).normal(0, 0.05, w.shape).astype(w.dtype)
                       for w in first.get_weights()])
    got = searches(other, x)
    assert read(other) == [[True], [True]]
    alone = transformer.rebuild(other, "fast")
    alone.graph_folder = None
    assert_same(got, searches(alone, x))
    assert any((ids.shape != w.shape or (ids != w).any()) for (ids, _), (w, _) in zip(got, want))


@pytest.mark.slow
@pytest.mark.parametrize("edit", ["a block's call", "the model's output layer"])
def test_an_edit_to_the_code_is_traced_anew_never_read_from_the_folder(copy_model, tmp_path, monkeypatch, edit):
    """A learner's edit made after a loop was kept (to DecoderBlock.call, or to Transformer.logits,
    a column barred) is another key: the loop is traced again with the edit, and decodes as the
    edited model does with no folder."""
    x, _, _ = copy_model[1](24)
    m = transformer.rebuild(copy_model[0], "fast", xla_decoding=False)
    m.graph_folder = str(tmp_path)
    unchanged = searches(m, x)
    before = kept_files(tmp_path)
    if edit == "a block's call":
        add_another_residual(monkeypatch)
    else:
        bar_a_column(monkeypatch, int(np.bincount(unchanged[0][0][unchanged[0][0] > 3]).argmax()))
    edited = transformer.rebuild(m, "fast")
    got = searches(edited, x)
    assert read(edited) == [[False], [False]]
    assert len(kept_files(tmp_path)) == len(before) + 2
    alone = transformer.rebuild(m, "fast")
    alone.graph_folder = None
    assert_same(got, searches(alone, x))
    assert (got[0][0].shape != unchanged[0][0].shape) or (got[0][0] != unchanged[0][0]).any()


def test_the_key_holds_the_code_as_it_is_now_closures_included(copy_model, monkeypatch):
    """The key changes with an edit's closure (the column barred), with a loop's setting, and with a
    module-level value of the project; the same model and code give the same key."""
    m = transformer.rebuild(copy_model[0], "fast", xla_decoding=False)
    plain = graphs.key(m, decoding.beam_loop, {"beam_size": 3})
    assert graphs.key(transformer.rebuild(m, "fast"), decoding.beam_loop, {"beam_size": 3}) == plain
    assert graphs.key(m, decoding.beam_loop, {"beam_size": 4}) != plain
    keys = set()
    for column in (4, 5):
        with monkeypatch.context() as patch:
            bar_a_column(patch, column)
            keys.add(graphs.key(m, decoding.beam_loop, {"beam_size": 3}))
    assert len(keys) == 2 and plain not in keys
    monkeypatch.setattr(decoding, "PAD_MULTIPLE", decoding.PAD_MULTIPLE + 1)
    assert graphs.key(m, decoding.beam_loop, {"beam_size": 3}) != plain


def test_a_broken_kept_file_is_traced_again_and_written_whole(copy_model, tmp_path):
    """A kept file that is not whole (cut short) is not read: the loop is traced and the file written
    again, whole, for the next model to read."""
    x, _, _ = copy_model[1](8)
    m = transformer.rebuild(copy_model[0], "fast", xla_decoding=False)
    m.graph_folder = str(tmp_path)
    want = decoding.greedy_decode(m, x)
    (path,) = tmp_path.iterdir()
    path.write_bytes(path.read_bytes()[:1000])
    again = transformer.rebuild(m, "fast")
    np.testing.assert_array_equal(decoding.greedy_decode(again, x), want)
    assert decoding.compiled(again, decoding.greedy_loop).read == [False]
    third = transformer.rebuild(m, "fast")
    np.testing.assert_array_equal(decoding.greedy_decode(third, x), want)
    assert decoding.compiled(third, decoding.greedy_loop).read == [True]


@pytest.mark.parametrize("dtype", ["float32", "mixed_bfloat16"])
def test_a_loop_called_through_graphs_computes_what_its_tf_function_computes(copy_model, dtype):
    """support.graphs.call runs a traced loop as the tf.function it was traced as runs it, to the
    same bits, in float32 and in mixed bfloat16 (where a graph optimized otherwise rounds otherwise):
    greedy and beam search, ids and scores."""
    x, _, _ = copy_model[1](24)
    m = transformer.rebuild(copy_model[0], "fast", xla_decoding=False, dtype=dtype)
    searches(m, x)  # traced, each loop, for its settings
    max_len = decoding.default_max_len(m, x.shape[1])
    for loop in (decoding.greedy_loop, decoding.beam_loop):
        (traced,) = decoding.compiled(m, loop).graphs.values()
        want = [t.numpy() for t in traced(x, max_len, 0)]
        got = [t.numpy() for t in graphs.call(m, *graphs.library_of(m, traced))(x, max_len, 0)]
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b)

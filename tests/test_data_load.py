import os
import subprocess
import sys

import numpy as np
import pytest

import data_load
from conftest import ROOT
from data_load import BOS, EOS, PAD


def random_lengths(n, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(1, 60, n), rng.integers(1, 60, n)


def test_output_ids_are_the_special_ids_and_those_of_the_training_targets():
    tgt = [np.array([9, 5, 9], np.int32), np.array([], np.int32), np.array([12, 3], np.int32)]
    assert data_load.output_ids("target", tgt) == [0, 1, 2, 3, 5, 9, 12]
    assert data_load.output_ids("all", tgt) is None


def test_token_budget_batches_cover_every_pair_once_within_budget():
    src, tgt = random_lengths(2000)
    budget = 512
    plans = [data_load.token_budget_batches(src, tgt, budget, np.random.default_rng([1, e])) for e in range(2)]
    for plan in plans:
        flat = np.concatenate(plan)
        assert sorted(flat.tolist()) == list(range(2000))  # each pair exactly once
        for idx in plan:
            padded = data_load.round_up(int(np.maximum(src[idx], tgt[idx]).max()))
            assert len(idx) == 1 or len(idx) * padded <= budget
    assert [b.tolist() for b in plans[0]] != [b.tolist() for b in plans[1]]  # reshuffled per epoch
    # bucketing: little padding
    padded = sum(len(i) * data_load.round_up(int(np.maximum(src[i], tgt[i]).max())) for i in plans[0])
    assert padded < 1.3 * np.maximum(src, tgt).sum()


def test_token_budget_batches_sort_by_cost_then_target_then_source():
    src, tgt = random_lengths(2000)
    up = data_load.round_up  # lengths as the batches pad them (to multiples of PAD_MULTIPLE)
    order = np.concatenate(data_load.token_budget_batches(src, tgt, 512))  # no rng: length order
    keys = list(zip(up(np.maximum(src, tgt)[order]), up(tgt[order]), up(src[order])))
    assert keys == sorted(keys)
    # What the two extra keys buy: padding on the source and target sides together, measured
    # against the real tokens: 16% on these lengths (three seeds), 45-46% sorted by cost alone.
    plan = data_load.token_budget_batches(src, tgt, 512, np.random.default_rng(0))
    padded = sum(len(i) * (up(int(src[i].max())) + up(int(tgt[i].max()))) for i in plan)
    assert padded < 1.25 * (src.sum() + tgt.sum())


@pytest.mark.parametrize("multiple", [1, 3, 8, 16])
def test_no_batch_is_padded_past_maxlen(multiple):
    """A learned position table has maxlen1 (maxlen2) rows: training, dev-loss and decoding batches
    are padded to the multiple but never past it, while lengths that fit keep the multiple."""
    rng = np.random.default_rng(multiple)
    maxlen1, maxlen2 = 30, 21
    src = [rng.integers(4, 50, n) for n in rng.integers(1, 40, 300)]
    tgt = [rng.integers(4, 50, n) for n in rng.integers(1, 30, 300)]
    train = data_load.TrainBatches(src, tgt, 256, 0, maxlen1, maxlen2, multiple)
    shapes, loss_shapes = set(), set()
    for batches, found in ((train.epoch(0), shapes), (data_load.loss_batches(src, tgt, 256, maxlen1, maxlen2),
                                                       loss_shapes)):
        for (x, d), y in batches:
            assert x.shape[1] <= maxlen1 and d.shape[1] == y.shape[1] <= maxlen2
            found.add((len(x), x.shape[1], d.shape[1]))
    for found, step in ((shapes, multiple), (loss_shapes, data_load.PAD_MULTIPLE)):
        assert all(t % step == 0 or t == limit
                   for _, *lengths in found for t, limit in zip(lengths, (maxlen1, maxlen2)))
    assert shapes == train.shapes(train.plan(0))  # what train.py counts and prints
    kept, _ = data_load.filter_long(src, tgt, maxlen1, maxlen2)
    x = data_load.encoder_inputs([src[i] for i in kept], multiple, limit=maxlen1)
    assert x.shape[1] == maxlen1
    longer = data_load.encoder_inputs([np.arange(4, 4 + maxlen1 + 2)], multiple, limit=maxlen1)
    assert longer.shape[1] == data_load.round_up(maxlen1 + 3, multiple)  # a sinusoid model translates it whole


def test_eval_batches_complete_and_in_order():
    lens = np.array([5, 300, 7, 7, 1, 64, 9])  # 300: longer than the budget, still kept
    batches = data_load.eval_batches(lens, 64)
    assert np.concatenate(batches).tolist() == list(range(len(lens)))
    sorted_batches = data_load.eval_batches(lens, 64, sort=True)
    assert sorted(np.concatenate(sorted_batches).tolist()) == list(range(len(lens)))


def test_decode_batches_are_full_but_the_last_and_their_shapes_do_not_depend_on_the_lines():
    rng = np.random.default_rng(0)
    budget, full_shapes = 512, set()
    for _ in range(20):  # files of many sizes and lengths
        lens = rng.integers(1, 70, size=int(rng.integers(1, 400)))
        batches = data_load.decode_batches(lens, budget, limit=64)
        assert sorted(np.concatenate([idx for idx, _ in batches]).tolist()) == list(range(len(lens)))
        # shortest first, within a length as across lengths: a batch's outputs end near one another
        assert np.all(np.diff(np.concatenate([lens[idx] for idx, _ in batches])) >= 0)
        for k, (idx, t1) in enumerate(batches):
            assert t1 >= lens[idx].max() and t1 % data_load.PAD_MULTIPLE == 0
            if k < len(batches) - 1:  # only the last batch is short
                assert len(idx) == max(1, budget // t1)
                full_shapes.add((len(idx), t1))
    # one full shape a padded length, whatever the file: a length's batches are always that many rows
    assert len(full_shapes) == len({t1 for _, t1 in full_shapes})
    assert [(i.tolist(), t1) for i, t1 in data_load.decode_batches([5], budget)] == [([0], 8)]  # a sentence alone
    # multiple 1 (loops that take any shape): a batch is padded to little more than its own lengths
    lens = rng.integers(1, 70, size=300)
    tight = data_load.decode_batches(lens, budget, limit=64, multiple=1)
    assert sorted(np.concatenate([idx for idx, _ in tight]).tolist()) == list(range(len(lens)))
    assert all(t1 >= lens[idx].max() and len(idx) * t1 <= max(budget, t1) for idx, t1 in tight)
    def padding(batches):
        return 1 - lens.sum() / sum(len(idx) * t1 for idx, t1 in batches)

    assert padding(tight) < padding(data_load.decode_batches(lens, budget, limit=64)) / 2, padding(tight)
    assert data_load.encoder_inputs([np.array([5, 6])], length=16).shape == (1, 16)


def test_batch_arrays_shift_and_special_tokens():
    src = [np.array([5, 6, 7]), np.array([8])]
    tgt = [np.array([9, 10]), np.array([11, 12, 13])]
    (x, decoder_in), labels = data_load.training_arrays(src, tgt)
    assert x.shape[1] % data_load.PAD_MULTIPLE == 0
    assert x[0, :4].tolist() == [5, 6, 7, EOS] and x[1, :2].tolist() == [8, EOS] and x[1, 2] == PAD
    assert decoder_in[1, :4].tolist() == [BOS, 11, 12, 13]
    assert labels[1, :4].tolist() == [11, 12, 13, EOS]
    # decoder input is the labels shifted right, but for </s>, which is only ever a label
    body = labels[:, :-1] != EOS
    assert (decoder_in[:, 1:][body] == labels[:, :-1][body]).all()


def test_train_batches_drop_long_pairs_and_repeat_plans():
    src = [np.arange(4, 4 + n) for n in (3, 10, 2, 40)]
    tgt = [np.arange(4, 4 + n) for n in (3, 4, 30, 2)]
    tb = data_load.TrainBatches(src, tgt, 64, seed=3, maxlen1=20, maxlen2=20)
    assert tb.dropped == 2 and len(tb) == 2
    assert [b.tolist() for b in tb.plan(5)] == [b.tolist() for b in tb.plan(5)]
    batches = list(tb.epoch(0))
    assert sum(b[1].shape[0] for b in batches) == 2


def test_every_epoch_has_a_new_plan_that_covers_every_pair_once():
    src_lens, tgt_lens = random_lengths(300, seed=1)
    src = [np.arange(4, 3 + n) for n in src_lens]  # n - 1 ids: n tokens with </s>
    tgt = [np.arange(4, 3 + n) for n in tgt_lens]
    tb = data_load.TrainBatches(src, tgt, 256, seed=7, maxlen1=100, maxlen2=100)
    plans = [[b.tolist() for b in tb.plan(epoch)] for epoch in range(4)]
    for epoch, plan in enumerate(plans):
        assert sorted(i for batch in plan for i in batch) == list(range(300))
        if epoch:
            assert plan != plans[epoch - 1]  # reshuffled
            assert sorted(map(tuple, plan)) != sorted(map(tuple, plans[epoch - 1]))  # regrouped, not only reordered
    other_seed = data_load.TrainBatches(src, tgt, 256, seed=8, maxlen1=100, maxlen2=100)
    assert [b.tolist() for b in other_seed.plan(0)] != plans[0]


def test_sentence_batches_are_the_references_random_fixed_size_batches():
    """--batch_sentences 128 (the reference's batching): every pair once an epoch, in random
    order, 128 a batch (the last one smaller), padded to its longest; a new order every epoch."""
    src_lens, tgt_lens = random_lengths(300, seed=2)
    src = [np.arange(4, 3 + n) for n in src_lens]
    tgt = [np.arange(4, 3 + n) for n in tgt_lens]
    tb = data_load.TrainBatches(src, tgt, 256, seed=7, maxlen1=100, maxlen2=100, multiple=1, batch_sentences=128)
    plan = tb.plan(0)
    assert [len(b) for b in plan] == [128, 128, 44]
    assert sorted(i for b in plan for i in b) == list(range(300))
    assert not all(np.diff(tb.src_lens[plan[0]]) >= 0)  # not sorted by length: random sentences
    assert [b.tolist() for b in tb.plan(1)] != [b.tolist() for b in plan]
    (x, _), y = next(tb.batches(plan[:1]))
    assert x.shape == (128, tb.src_lens[plan[0]].max()) and y.shape == (128, tb.tgt_lens[plan[0]].max())


def test_filter_long_keeps_pairs_of_exactly_maxlen_tokens_with_eos():
    maxlen1, maxlen2 = 10, 12
    # ids without </s>: n ids are n + 1 tokens; around each limit, one side at a time
    sizes = [(maxlen1 - 2, 3), (maxlen1 - 1, 3), (maxlen1, 3),
             (3, maxlen2 - 2), (3, maxlen2 - 1), (3, maxlen2)]
    src = [np.full(a, 5) for a, _ in sizes]
    tgt = [np.full(b, 6) for _, b in sizes]
    keep, dropped = data_load.filter_long(src, tgt, maxlen1, maxlen2)
    assert keep.tolist() == [0, 1, 3, 4] and dropped == 2
    tb = data_load.TrainBatches(src, tgt, 1024, seed=0, maxlen1=maxlen1, maxlen2=maxlen2)
    assert tb.dropped == 2 and sorted(tb.src_lens.tolist()) == [4, 4, maxlen1 - 1, maxlen1]


def test_tf_dataset_yields_the_numpy_batches():
    src = [np.array([5, 6]), np.array([7])]
    tgt = [np.array([8]), np.array([9, 10])]
    batches = [data_load.training_arrays(src, tgt)]
    ds = data_load.tf_dataset(lambda: iter(batches), 1)
    (x, d), y = next(iter(ds))
    assert (x.numpy() == batches[0][0][0]).all() and (y.numpy() == batches[0][1]).all()
    assert ds.cardinality() == 1
    # autotuning off: its sleeping thread could hold up the end of an epoch (data_load.tf_dataset)
    assert ds.options().autotune.enabled is False


FAULTS = """
import resource, sys
sys.path.insert(0, sys.argv[1])
from support import utils  # noqa: F401  (sets the allocator, as every script's imports do)
import tensorflow as tf
x, w = tf.ones((2048, 256)), tf.ones((256, 8000))
step = tf.function(lambda x, w: tf.reduce_sum(tf.exp(tf.matmul(x, w) * 1e-3)))  # 65 MB temporaries
step(x, w)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    step(x, w)
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 5)
"""


@pytest.mark.slow
def test_large_tensors_reuse_memory_instead_of_page_faulting():
    """utils turns on TensorFlow's BFC CPU allocator: 65 MB temporaries (the logits' size at 2,048
    tokens and 8k pieces) are not page-faulted in anew every step, as with malloc's fresh maps."""
    def faults(env):
        done = subprocess.run([sys.executable, "-c", FAULTS, ROOT], capture_output=True, text=True,
                              timeout=300, env=env)
        assert done.returncode == 0, done.stderr[-2000:]
        return float(done.stdout.split()[-1])

    env = {k: v for k, v in os.environ.items() if k != "TF_CPU_ALLOCATOR_USE_BFC"}
    ours, default = faults(env), faults(dict(env, TF_CPU_ALLOCATOR_USE_BFC="false"))
    if default < 4000:
        pytest.skip(f"malloc did not page-fault large tensors here ({default:.0f} faults a call)")
    assert ours < default / 4, (ours, default)


def test_subword_sampling_resegments_each_epoch_reproducibly(tmp_path):
    """BPE-dropout (--subword_sampling): each epoch's pairs are a new segmentation of the same text,
    the same again for the same (seed, epoch); every piece a sampled target holds is among
    pieces_within, so the softmax covers it; alpha 0 is the deterministic segmentation."""
    from conftest import ENGLISH, GERMAN
    from prepro import train_bpe
    sp = train_bpe(GERMAN * 20 + ENGLISH * 20, str(tmp_path / "bpe"), 120, 0)
    src, tgt = GERMAN * 20, ENGLISH * 20
    resegment = data_load.resegmenter(sp, src, tgt, 0.5, 7)
    first, again, second = resegment(0), resegment(0), resegment(1)
    assert first == again and first != second
    assert [sp.decode(ids) for ids in first[1]] == tgt  # the same text, other pieces
    assert sum(map(len, first[1])) > sum(map(len, sp.encode(tgt)))
    within = set(data_load.pieces_within(sp, tgt))
    assert {i for ids in first[1] + second[1] for i in ids} <= within
    assert not within >= {i for ids in sp.encode(src) for i in ids}  # German-only pieces stay out
    batches = data_load.TrainBatches(sp.encode(src), sp.encode(tgt), 256, 7, 50, 50, resegment=resegment,
                                     extra_target_ids=sorted(within))
    plan = batches.plan(1)
    assert batches.tgt == second[1] and sorted(np.concatenate(plan).tolist()) == list(range(len(tgt)))
    assert set(data_load.output_ids("target", batches.target_ids())) == within | {0, 1, 2, 3}
    assert data_load.resegmenter(sp, src, tgt, 0.0, 7)(0) == (sp.encode(src), sp.encode(tgt))


def test_subword_sampling_repeats_in_another_process_and_is_sentencepieces_bpe():
    """The same (seed, epoch) gives the same segmentation in two processes (sentencepiece's own
    sampling does not, whatever its seed); without dropout, BpeDropout's ids are sp.encode's for
    every training sentence of the sample, on both sides."""
    corpus = os.path.join(ROOT, "corpora", "sample")
    code = ("import hashlib, sys, data_load, prepro; from conftest import GERMAN, ENGLISH; "
            "sp = prepro.train_bpe(GERMAN * 20 + ENGLISH * 20, sys.argv[1], 120, 0); "
            "print(hashlib.sha256(repr(data_load.resegmenter(sp, GERMAN, ENGLISH, 0.3, 5)(2)).encode()).hexdigest())")
    import tempfile
    digests = []
    for _ in range(2):
        with tempfile.TemporaryDirectory() as scratch:
            run = subprocess.run([sys.executable, "-c", code, os.path.join(scratch, "bpe")], cwd=ROOT,
                                 capture_output=True, text=True, timeout=120,
                                 env=dict(os.environ, PYTHONPATH=os.path.join(ROOT, "tests")))
        assert run.returncode == 0, run.stderr[-2000:]
        digests.append(run.stdout.split()[-1])
    assert digests[0] == digests[1]
    from prepro import train_bpe
    with tempfile.TemporaryDirectory() as scratch:
        texts = {lang: open(os.path.join(corpus, f"train.{lang}"), encoding="utf-8").read().splitlines()
                 for lang in ("de", "en")}
        sp = train_bpe(texts["de"] + texts["en"], os.path.join(scratch, "bpe"), 400, 0)
        dropout = data_load.BpeDropout(sp)
        for lines in texts.values():
            assert [dropout.encode(data_load.clean(line)) for line in lines] == sp.encode(
                [data_load.clean(line) for line in lines])


def test_the_graph_cleaning_is_the_python_cleaning():
    """clean_tensor (the SavedModel's) gives what clean gives: byte-order marks, tabs, CR, line and
    paragraph separators, no-break and ideographic spaces, control characters, NFKC's ligatures
    and full-width letters."""
    pytest.importorskip("tensorflow_text")
    lines = ["\ufeffEin  Mann\tfährt\r\nFahrrad.", "a\u2028b\u2029c\u00a0d\u3000e", "\x07bell\x1f and \x85next",
             "ﬁnde Ｆｕｌｌ ①", "  ", "", "Straße\u200bhier"]
    got = [s.decode() for s in data_load.clean_tensor(lines).numpy()]
    assert got == [data_load.clean(line) for line in lines]


def test_length_buckets_pad_least_and_are_found_exactly():
    """length_buckets against trying every choice: on random lengths (1-12, 40 pairs), for 1 to 4
    buckets, the padded tokens (each pair padded square to its bucket) are the fewest possible, and
    the last bucket holds the longest pair."""
    import itertools
    rng = np.random.default_rng(0)
    for trial in range(20):
        src, tgt = rng.integers(1, 13, 40), rng.integers(1, 13, 40)
        longer = np.maximum(src, tgt)

        def padded(buckets, longer=longer):
            return 2 * sum(min(b for b in buckets if b >= n) for n in longer)
        values = sorted(set(longer.tolist()))
        for count in range(1, 5):
            found = data_load.length_buckets(src, tgt, count)
            assert len(found) <= count and found[-1] == longer.max()
            best = min(padded(list(c) + [values[-1]]) for k in range(count)
                       for c in itertools.combinations(values[:-1], k))
            assert padded(found) == best, (trial, count, found)


def test_bucketed_batches_come_in_few_shapes_and_hold_every_pair_once():
    """TrainBatches with buckets, on 20,000 pairs of IWSLT 2016 lengths (the bench's drawing: long-tailed,
    up to 99 tokens; 4,096-token batches) and 29,000 of Multi30k-like ones (gamma, mean 13; the
    multi30k preset's 1,024-token batches): every pair once an epoch, at most 16
    shapes (one a bucket, the budget // length rows), at most 20% of the tokens padding, and every
    batch of its shape: the pairs' rows as training_arrays makes them, then rows of padding alone."""
    sys.path.insert(0, os.path.join(ROOT, "bench"))  # the bench's scripts import their folder's modules
    from train_speed import iwslt_like

    rng = np.random.default_rng(1)
    multi30k = [rng.integers(4, 400, n) for n in np.clip(rng.gamma(4.0, 3.3, 29000), 3, 50).astype(int)]
    multi30k_tgt = [rng.integers(4, 400, max(2, int(len(s) * rng.lognormal(-0.05, 0.15)))) for s in multi30k]
    for (src, tgt), budget in ((iwslt_like(1000, 0, pairs=20000), 4096), ((multi30k, multi30k_tgt), 1024)):
        train = data_load.TrainBatches(src, tgt, budget, 0, 100, 100, buckets=16)
        plan = train.plan(0)
        assert sorted(np.concatenate(plan).tolist()) == list(range(len(train)))
        shapes = train.shapes(plan)
        assert len(shapes) <= 16 and train.padding(plan) <= 0.20, (len(shapes), train.padding(plan))
        assert all(rows == budget // t1 and t1 == t2 for rows, t1, t2 in shapes)
        for idx, ((x, d), y) in list(zip(plan, train.batches(plan)))[:50]:
            assert x.shape + d.shape[1:] == train.shape(idx) and y.shape == d.shape
            (x0, d0), y0 = data_load.training_arrays([train.src[i] for i in idx], [train.tgt[i] for i in idx],
                                                     multiple=1)
            n, t1, t2 = len(idx), x0.shape[1], d0.shape[1]
            assert (x[:n, :t1] == x0).all() and (d[:n, :t2] == d0).all() and (y[:n, :t2] == y0).all()
            assert not x[:, t1:].any() and not d[:, t2:].any() and not x[n:].any() and not y[n:].any()


def test_an_explicit_length_multiple_turns_the_buckets_off_where_steps_are_compiled():
    """devices.length_buckets: 16 where steps are compiled (XLA on), none where they are not, none
    when --length_multiple is given, and --length_buckets as given."""
    import dataclasses

    import hyperparams
    from support import devices

    hp = hyperparams.Hparams()
    assert devices.length_buckets(dataclasses.replace(hp, jit_compile="on")) == devices.COMPILED_BUCKETS == 16
    assert devices.length_buckets(dataclasses.replace(hp, jit_compile="off")) == 0
    assert devices.length_buckets(dataclasses.replace(hp, jit_compile="on", length_multiple=8)) == 0
    assert devices.length_buckets(dataclasses.replace(hp, jit_compile="off", length_buckets=4)) == 4

"""What each of kernels/fast.py's kernels gains, measured side by side in one run: training steps with the
plain parts, with each training kernel alone, with all of them (--kernels fast) and with all but
one; beam search with and without its kernel. Rounds alternate the configurations, so a slow
spell of a shared machine falls on all of them. A kernel's speed-up is plain's time over its own,
round by round; kernels/fast.py keeps the kernels that were faster in at least 12 of 15 counted rounds
pooled over three runs (a coin does that about 1 time in 57). Adam's update is also timed alone,
as it is a few percent of a step. noise is the spread of the plain configuration's own times over
the rounds (max / min - 1).

    python bench/kernel_speed.py --preset multi30k --precision float32

The last line is machine-readable:
kernel_speed noise=<x> <kernel>=<median speed-up over plain>/<rounds faster> ...
last_<kernel>=<median speed-up of fast over fast without it>/<rounds faster> ... adam_update=<...>/<...>
beam_<kernel>=<...>/<...>
"""
import dataclasses
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

import common  # noqa: E402  (bench/common.py)

import data_load  # noqa: E402
from support import devices  # noqa: E402
import hyperparams  # noqa: E402
from support.utils import run_cli, section  # noqa: E402

TRAINING = ("projections", "feed_forward", "dropout", "layer_norm", "cross_entropy", "adam")
DECODING = ("projections", "beam_cache")


def alternate(configs, run_once, rounds):
    """{config: [seconds of each round]}, the configs run in turn in every round, after a first
    round that is not counted (the first timed passes ran slower for every configuration)."""
    times = {c: [] for c in configs}
    for r in range(rounds + 1):
        for c in configs:
            times[c].append(run_once(c))
        print(f"round {r}{' (warm-up, not counted)' if r == 0 else ''}: "
              + "  ".join(f"{c} {times[c][-1]:.2f}s" for c in configs), flush=True)
    return {c: t[1:] for c, t in times.items()}


def summary(times, baseline):
    """Print each config's median time and its speed-up over baseline round by round (the two ran
    minutes apart in the same round: paired); returns {config: (median speed-up, rounds faster)}."""
    gains = {}
    for c, t in times.items():
        ratios = [b / x for b, x in zip(times[baseline], t)]
        gains[c] = (float(np.median(ratios)), sum(r > 1 for r in ratios))
        print(f"{c:22s} median {np.median(t):7.2f} s  speed-up over {baseline}: median {gains[c][0]:.2f}x, "
              f"rounds {min(ratios):.2f}-{max(ratios):.2f}x, faster in {gains[c][1]} of {len(ratios)}")
    return gains


def traced_model(hp, kernels, vocab_size, output_ids, batches, seed):
    """The model built with `kernels`, compiled, and trained once on a batch of every shape (traced)."""
    import keras

    import model as transformer

    keras.utils.set_random_seed(seed)
    m = transformer.compile_model(transformer.make_model(dataclasses.replace(hp, kernels=kernels), vocab_size,
                                                         output_ids), hp, total_steps=10 ** 6)
    for (x, d), y in {(x.shape, d.shape): ((x, d), y) for (x, d), y in batches}.values():
        m.train_on_batch((x, d), y)
    return m


def time_adam_update(model, rounds, repeats=20):
    """{config: [seconds]}: `repeats` updates of the model's weights from fixed gradients by Keras'
    Adam (plain) and fast.Adam, in alternating rounds. One update is a few percent of a training
    step: this times it without the rest of the step's noise. TensorFlow only (elsewhere fast.Adam
    is Keras')."""
    import keras
    import tensorflow as tf

    from kernels import fast

    variables = model.trainable_variables
    grads = [keras.random.normal(v.shape, stddev=1e-3, seed=i) for i, v in enumerate(variables)]
    updates = {}
    for c, adam in (("plain", keras.optimizers.Adam), ("adam", fast.Adam)):
        optimizer = adam(learning_rate=1e-4, beta_1=0.9, beta_2=0.98, epsilon=1e-9)
        optimizer.build(variables)
        updates[c] = tf.function(lambda o=optimizer: o.apply(grads, variables))
        updates[c]()  # compile

    def update_once(c):
        start = time.perf_counter()
        for _ in range(repeats):
            updates[c]()
        return time.perf_counter() - start

    return alternate(tuple(updates), update_once, rounds)


def time_beam_search(model, hp, args):
    """{config: [seconds]}: beam search over dev sentences with the plain beam loop and each
    decoding kernel, exactly 30 tokens a sentence, in alternating rounds."""
    import decoding
    import model as transformer

    src = data_load.load_split(hp.prepro_dir, "dev")[0][:args.sentences]
    order = np.argsort([len(s) for s in src], kind="stable")
    sources = [data_load.encoder_inputs([src[i] for i in order[j:j + 64]]) for j in range(0, len(src), 64)]
    configs = ("plain",) + DECODING
    models = {c: transformer.rebuild(model, c) for c in configs}  # the same weights, each with its parts

    def decode_once(c):
        start = time.perf_counter()
        for x in sources:
            decoding.beam_search(models[c], x, args.beam_size, 0.6, max_len=30, min_len=30)
        return time.perf_counter() - start

    for c in configs:
        decode_once(c)  # compile
    return alternate(configs, decode_once, args.rounds)


def main(argv=None):
    parser = common.parser(__doc__)
    parser.add_argument("--steps", type=int, default=20, help="training batches timed per configuration and round")
    parser.add_argument("--rounds", type=int, default=5, help="counted rounds, after one warm-up round")
    parser.add_argument("--precision", default="float32", choices=hyperparams.PRECISIONS)
    parser.add_argument("--sentences", type=int, default=256, help="dev sentences for beam search")
    parser.add_argument("--beam_size", type=int, default=4)
    parser.add_argument("--measure", default=",".join(TRAINING),
                        help="the training kernels to measure alone and as the last one added")
    parser.add_argument("--record", metavar="PATH", help="also write the figures as a record (support/records.py) "
                                                         "to this JSON file: each configuration's seconds round by "
                                                         "round and its speed-up over plain")
    args, hp = common.parse(parser, argv)
    hp = dataclasses.replace(hp, precision=args.precision, jit_compile="auto", strategy="one")
    import keras

    run = devices.setup(hp)
    print(run.describe())
    vocab_size = data_load.load_meta(hp.prepro_dir)["vocab_size"]
    train = data_load.TrainBatches(*data_load.load_split(hp.prepro_dir, "train"), hp.tokens_per_batch,
                                   args.seed, hp.maxlen1, hp.maxlen2, run.length_multiple,
                                   buckets=run.length_buckets)
    output_ids = data_load.output_ids(hp.output_vocab, train.tgt)
    batches = list(train.batches(train.plan(0)[:args.steps]))

    section(f"Train: {args.steps} bucketed batches of {args.preset}, {args.rounds} alternating rounds")
    measured = tuple(k for k in TRAINING if k in args.measure.split(","))
    without = tuple(",".join(k for k in TRAINING if k != kernel) for kernel in measured)  # fast less one
    configs = ("plain",) + measured + ("fast",) + without
    models = {c: traced_model(hp, c, vocab_size, output_ids, batches, args.seed) for c in configs}

    def train_once(c):
        start = time.perf_counter()
        for (x, d), y in batches:
            models[c].train_on_batch((x, d), y)
        return time.perf_counter() - start

    train_times = alternate(configs, train_once, args.rounds)
    train_gains = summary({c: train_times[c] for c in ("plain",) + measured + ("fast",)}, "plain")
    print("each kernel as the last one added: fast against fast without it")
    last_gains = summary({"fast": train_times["fast"],
                          **{f"without_{k}": train_times[w] for k, w in zip(measured, without)}}, "fast")

    adam_gains = {"adam": (1.0, 0)}
    if keras.backend.backend() == "tensorflow":
        section(f"Adam: 20 updates of the model's weights, {args.rounds} alternating rounds")
        adam_gains = summary(time_adam_update(models["plain"], args.rounds), "plain")

    section(f"Beam search {args.beam_size}: {args.sentences} dev sentences, batches of 64, {args.rounds} rounds")
    beam_times = time_beam_search(models["plain"], hp, args)
    beam_gains = summary(beam_times, "plain")
    noise = max(max(t) / min(t) - 1 for t in (train_times["plain"], beam_times["plain"]))
    line = f"kernel_speed noise={noise:.3f} " + " ".join(
        f"{c}={g:.2f}/{n}" for c, (g, n) in train_gains.items() if c != "plain")
    line += " " + " ".join(f"last_{c[len('without_'):]}={1 / g:.2f}/{len(train_times['fast']) - n}"
                           for c, (g, n) in last_gains.items() if c != "fast")
    line += f" adam_update={adam_gains['adam'][0]:.2f}/{adam_gains['adam'][1]}"
    line += " " + " ".join(f"beam_{c}={g:.2f}/{n}" for c, (g, n) in beam_gains.items() if c != "plain")
    if args.record:
        from support import records

        def gains(found):  # {config: (median speed-up, rounds faster)} as named fields
            return {c: dict(median=g, faster=n) for c, (g, n) in found.items()}

        figures = dict(rounds=args.rounds, steps=args.steps, sentences=args.sentences, beam_size=args.beam_size,
                       noise=noise, train_seconds=train_times, beam_seconds=beam_times, train=gains(train_gains),
                       last=gains(last_gains), adam=gains(adam_gains), beam=gains(beam_gains))
        records.write(args.record, records.make("kernel_speed", figures, args.precision))
        print(f"wrote the figures to {args.record}")
    print(line)


if __name__ == "__main__":
    run_cli(main)

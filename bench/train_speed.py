"""Training speed, side by side in one run: the machine's matmul throughput, training throughput
with token-budget bucketed batches, with reference-shaped batches and, optionally, with synthetic
batches shaped like IWSLT 2016, projected to a whole IWSLT 2016 run.

    python bench/train_speed.py --preset multi30k --steps 30                     # a 2-core CPU
    KERAS_BACKEND=jax python bench/train_speed.py --preset iwslt2016 \\
        --prepro_dir prepro/multi30k --iwslt_synthetic 1                         # a GPU, bf16

Measures, through the same Keras backend:
  - matmul GFLOP/s in float32 and, where the run uses it, bfloat16/float16 (best of a few
    square sizes: 1024-3072 on a CPU, 4096-8192 on a GPU);
  - training after warm-up: target tokens/s, source+target tokens/s, seconds per step, training
    FLOPs per step counted from the layer shapes over the real (unpadded) tokens: 6 x weights x
    tokens for every matmul (encoder per source token, decoder and output projection per target
    token, cross-attention keys/values per source token) plus 3 x the forward attention products
    (4 x T_q x T_k x d_model per layer and sentence); achieved GFLOP/s and its ratio to the matmul
    peak of the run's precision (MFU; also against the float32 peak when the run is mixed
    precision, the default on CPUs with bfloat16 instructions); peak resident memory. The warm-up
    trains once on a batch of every distinct shape (each shape is one compilation under XLA/JAX:
    their number is printed);
  - the same with reference-shaped batches: 128 sentences in random order, padded to the longest;
  - side by side, yardsticks of the same size on the same 128-sentence batches, random and
    length-sorted (--yardsticks: a plain Keras 3 model in float32, the same in mixed_bfloat16 where
    this run trains in it, and PyTorch's nn.Transformer, see bench/yardsticks.py; PyTorch where it
    is installed), and this port on the length-sorted ones;
  - with --iwslt_synthetic 1: random ids whose lengths follow IWSLT 2016 de-en (196,884 training
    pairs, about 23 source and 22 target tokens on average, lengths up to maxlen 100), batched as
    train.py batches them, with the model's vocabulary; from its s/step the seconds per IWSLT 2016
    epoch and for the preset's num_epochs are projected.
Real batches come from --prepro_dir (its train split; run prepro.py first) with the preset's model
size over that vocabulary.

The last line is machine-readable:
train_speed preset=<p> tgt_tok_s=<n> mfu=<x> ref_shaped_tgt_tok_s=<n> peak_rss_mb=<n> precision=<policy>
mfu_float32=<x> [sorted_tgt_tok_s=<n> <yardstick>_random_tgt_tok_s=<n> <yardstick>_sorted_tgt_tok_s=<n> ...]
[iwslt_tgt_tok_s=<n> iwslt_mfu=<x> iwslt_epoch_s=<n> iwslt_run_min=<n>]
"""
import dataclasses
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

import common  # noqa: E402  (bench/common.py)
import yardsticks  # noqa: E402  (bench/yardsticks.py)

import data_load  # noqa: E402
from support import devices  # noqa: E402
import hyperparams  # noqa: E402
from support.utils import UserError, peak_rss_mb, run_cli, section  # noqa: E402

IWSLT_PAIRS = 196_884  # IWSLT 2016 de-en training pairs after prepro (train.tags, tag lines dropped)


def matmul_gflops(dtype="float32", sizes=None, repeats=5):
    """Best matmul throughput of the backend over a few square sizes, in GFLOP/s."""
    import keras
    from keras import ops

    sizes = sizes or ((4096, 6144, 8192) if devices.gpus() else (1024, 2048, 3072))
    matmul = ops.matmul
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf
        matmul = tf.function(ops.matmul)
    elif keras.backend.backend() == "jax":
        import jax
        matmul = jax.jit(ops.matmul)
    best = 0.0
    for n in sizes:
        a = ops.cast(np.random.default_rng(0).standard_normal((n, n)).astype("float32"), dtype)
        ops.convert_to_numpy(ops.cast(matmul(a, a)[0, 0], "float32"))  # warm up (NumPy has no bfloat16)
        for _ in range(repeats):
            start = time.perf_counter()
            ops.convert_to_numpy(ops.cast(matmul(a, a)[0, 0], "float32"))
            best = max(best, 2 * n ** 3 / (time.perf_counter() - start) / 1e9)
    return best


def training_flops(hp, vocab_size, src_lens, tgt_lens):
    """Training FLOPs of one batch over its real tokens (lengths with </s> or <s>)."""
    d, f, b = hp.d_model, hp.d_ff, hp.num_blocks
    src, tgt = float(np.sum(src_lens)), float(np.sum(tgt_lens))
    enc_per_src = b * (4 * d * d + 2 * d * f)  # self-attention Q, K, V, O and feed-forward
    dec_per_tgt = b * (4 * d * d + 2 * d * d + 2 * d * f) + d * vocab_size  # self QKVO, cross Q,O, FF, output
    cross_kv_per_src = b * 2 * d * d
    matmuls = 6 * (src * (enc_per_src + cross_kv_per_src) + tgt * dec_per_tgt)
    s, t = np.asarray(src_lens, float), np.asarray(tgt_lens, float)
    attention_fwd = b * 4 * d * float(np.sum(s * s) + np.sum(t * t) + np.sum(t * s))  # enc self, dec self, cross
    return matmuls + 3 * attention_fwd


def measure(model, batches, hp, vocab_size):
    """Train once on a batch of every distinct shape (tracing, compiling), then time all batches.

    Returns a dict of figures. The output projection's FLOPs count the model's logits columns (this
    port's output_size: --output_vocab target covers fewer ids than vocab_size)."""
    shapes = {}
    for (x, d), y in batches:
        shapes.setdefault((x.shape, d.shape), ((x, d), y))
    start = time.perf_counter()
    for (x, d), y in shapes.values():
        model.train_on_batch((x, d), y)
    warmup = time.perf_counter() - start
    start = time.perf_counter()
    for (x, d), y in batches:
        model.train_on_batch((x, d), y)
    seconds = time.perf_counter() - start
    src_lens = [int((x != 0).sum(1).sum()) for (x, _), _ in batches]
    tgt_lens = [int((y != 0).sum(1).sum()) for _, y in batches]
    columns = getattr(model, "output_size", vocab_size)
    flops = sum(training_flops(hp, columns, (x != 0).sum(1), (y != 0).sum(1)) for (x, _), y in batches)
    padded = sum(x.size + y.size for (x, _), y in batches)
    return dict(seconds=seconds, steps=len(batches), tgt_tok_s=sum(tgt_lens) / seconds,
                tok_s=(sum(src_lens) + sum(tgt_lens)) / seconds, step_s=seconds / len(batches),
                gflops=flops / seconds / 1e9, flops_per_step=flops / len(batches),
                padding=1 - (sum(src_lens) + sum(tgt_lens)) / padded, shapes=len(shapes), warmup=warmup)


def reference_shaped(src, tgt, steps, seed, batch_size=128):
    """Batches as the reference forms them: batch_size random sentences padded to the longest
    (tf.data padded_batch: no rounding up)."""
    rng = np.random.default_rng(seed)
    needed = steps * batch_size  # a small corpus is gone through more than once
    order = np.concatenate([rng.permutation(len(src)) for _ in range(-(-needed // len(src)))])
    return [data_load.training_arrays([src[i] for i in order[j:j + batch_size]],
                                      [tgt[i] for i in order[j:j + batch_size]], multiple=1)
            for j in range(0, steps * batch_size, batch_size)]


def length_sorted(src, tgt, steps, seed, batch_size=128):
    """Batches of batch_size sentences of similar length: the corpus sorted by source then target
    length (ties in random order), cut into batches, the batches in random order."""
    rng = np.random.default_rng(seed)
    order = np.lexsort((rng.random(len(src)), [len(t) for t in tgt], [len(s) for s in src]))
    chunks = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    picked = np.resize(rng.permutation(len(chunks)), steps)  # a small corpus is gone through more than once
    return [data_load.training_arrays([src[i] for i in chunks[c]], [tgt[i] for i in chunks[c]], multiple=1)
            for c in picked]


def iwslt_like(vocab_size, seed, pairs=IWSLT_PAIRS, maxlen=100):
    """Random id sequences (src, tgt) whose lengths follow IWSLT 2016 de-en subword statistics.

    Source lengths: a gamma distribution (shape 2.2, mean 23 tokens: TED sentences are long-tailed);
    target: the source length times a log-normal ratio of median 0.95; both clipped to
    [1, maxlen - 1] so that every pair fits with </s>.
    """
    rng = np.random.default_rng(seed)
    src_lens = np.clip(np.round(rng.gamma(2.2, 23 / 2.2, pairs)), 1, maxlen - 1).astype(int)
    tgt_lens = np.clip(np.round(src_lens * 0.95 * rng.lognormal(0, 0.2, pairs)), 1, maxlen - 1).astype(int)
    ids = rng.integers(4, vocab_size, src_lens.sum() + tgt_lens.sum()).astype(np.int32)  # all at once: fast
    src_ids, tgt_ids = ids[:src_lens.sum()], ids[src_lens.sum():]
    return np.split(src_ids, np.cumsum(src_lens)[:-1]), np.split(tgt_ids, np.cumsum(tgt_lens)[:-1])


def report(name, r, peak):
    print(f"{name}: {r['tgt_tok_s']:.0f} target tok/s, {r['tok_s']:.0f} source+target tok/s, {r['step_s']:.3f} s/step, "
          f"{r['flops_per_step'] / 1e9:.1f} GFLOP/step, {r['gflops']:.0f} GFLOP/s, MFU {r['gflops'] / peak:.2f}, "
          f"padding {100 * r['padding']:.0f}%, {r['shapes']} batch shapes (warm-up {r['warmup']:.1f} s)", flush=True)


def side_by_side(names, hp, vocab_size, output_ids, random_batches, sorted_batches, results, peak, args):
    """Train each yardstick on random and on length-sorted 128-sentence batches, print the three
    models side by side; returns the summary line's fields for them."""
    figures = {"this port": (results.get("reference-shaped")
                             or measure_ours(hp, vocab_size, output_ids, random_batches, args),
                             results["length-sorted"])}
    fields = ""
    for name in names:
        row = []
        for kind, batches in (("random", random_batches), ("sorted", sorted_batches)):
            section(f"Train: {yardsticks.NAMES[name]}, {kind} 128-sentence batches")
            try:
                model = yardsticks.build(name, hp, vocab_size, args.seed)
            except ImportError as e:
                print(f"skipped: {e}")
                break
            row.append(measure(model, batches, hp, vocab_size))
            report(name, row[-1], peak)
            fields += f" {name}_{kind}_tgt_tok_s={row[-1]['tgt_tok_s']:.0f}"
        if len(row) == 2:
            figures[yardsticks.NAMES[name]] = tuple(row)
    section("Side by side: target tok/s on the same batches")
    ours = results["bucketed"]["tgt_tok_s"]
    print(f"{'model':55} {'random 128':>11} {'sorted 128':>11} {'token budget':>13}")
    for name, (random, by_length) in figures.items():
        budget = f"{ours:13.0f}" if name == "this port" else f"{'-':>13}"
        print(f"{name:55} {random['tgt_tok_s']:11.0f} {by_length['tgt_tok_s']:11.0f} {budget}")
    port_random, port_sorted = (r["tgt_tok_s"] for r in figures["this port"])
    port_best = max(ours, port_random, port_sorted)
    for name, (random, by_length) in list(figures.items())[1:]:
        print(f"this port / {name}: {port_random / random['tgt_tok_s']:.2f}x on random, "
              f"{port_sorted / by_length['tgt_tok_s']:.2f}x on sorted batches; best against best "
              f"{port_best / max(random['tgt_tok_s'], by_length['tgt_tok_s']):.2f}x")
    return fields


def measure_ours(hp, vocab_size, output_ids, batches, args):
    """This port's figures on the given batches, its logits over output_ids (None: every id)."""
    import keras

    import model as transformer

    keras.utils.set_random_seed(args.seed)
    # The learning rate does not change the time of a step; a linear decay gets the bench's length.
    model = transformer.compile_model(transformer.make_model(hp, vocab_size, output_ids), hp,
                                      total_steps=len(batches))
    return measure(model, batches, hp, vocab_size)


def batches_to_measure(hp, run, args, names):
    """The batches to train on: (runs: [(name, hp, vocabulary size, output ids, batches)], the
    vocabulary size, the output ids, the reference-shaped batches, the length-sorted ones (None
    without yardsticks), the IWSLT 2016-shaped epoch plan (None without --iwslt_synthetic))."""
    section("Data")
    vocab_size = data_load.load_meta(hp.prepro_dir)["vocab_size"]
    train = data_load.TrainBatches(*data_load.load_split(hp.prepro_dir, "train"), hp.tokens_per_batch,
                                   args.seed, hp.maxlen1, hp.maxlen2, run.length_multiple,
                                   buckets=run.length_buckets)
    output_ids = data_load.output_ids(hp.output_vocab, train.tgt)
    runs = [("bucketed", hp, vocab_size, output_ids, list(train.batches(train.plan(0)[:args.steps])))]
    random_batches = reference_shaped(train.src, train.tgt, args.steps, args.seed)  # the yardsticks' too
    if args.reference_shaped:
        runs.append(("reference-shaped", hp, vocab_size, output_ids, random_batches))
    print(f"{args.preset}: d_model {hp.d_model}, d_ff {hp.d_ff}, {hp.num_blocks}+{hp.num_blocks} blocks, "
          f"{hp.num_heads} heads, vocab {vocab_size} ({hp.prepro_dir}), softmax over "
          f"{len(output_ids) if output_ids else vocab_size} ids (--output_vocab {hp.output_vocab}); "
          f"token budget {hp.tokens_per_batch}")
    if names:
        sorted_batches = length_sorted(train.src, train.tgt, args.steps, args.seed)
        runs.append(("length-sorted", hp, vocab_size, output_ids, sorted_batches))
    if args.iwslt_synthetic:
        iwslt_vocab = hp.vocab_size
        src, tgt = iwslt_like(iwslt_vocab, args.seed)
        synthetic = data_load.TrainBatches(src, tgt, hp.tokens_per_batch, args.seed, hp.maxlen1, hp.maxlen2,
                                           run.length_multiple, buckets=run.length_buckets)
        iwslt_plan = synthetic.plan(0)
        print(f"IWSLT 2016-shaped: {len(src):,} pairs, mean {np.mean(synthetic.src_lens) - 1:.1f} source / "
              f"{np.mean(synthetic.tgt_lens) - 1:.1f} target tokens, vocab {iwslt_vocab}: {len(iwslt_plan)} batches "
              f"an epoch in {len(synthetic.shapes(iwslt_plan))} distinct shapes, "
              f"{synthetic.padding(iwslt_plan):.1%} of their tokens padding")
        order = np.random.default_rng(args.seed).permutation(len(iwslt_plan))[:args.steps]
        runs.append(("IWSLT 2016-shaped", hp, iwslt_vocab, data_load.output_ids(hp.output_vocab, synthetic.tgt),
                     list(synthetic.batches([iwslt_plan[i] for i in order]))))
    return runs, vocab_size, output_ids, random_batches, (sorted_batches if names else None), \
        (iwslt_plan if args.iwslt_synthetic else None)


def build_parser():
    """The bench's options, beside the settings of bench/common.py."""
    parser = common.parser(__doc__)
    parser.add_argument("--steps", type=int, default=30, help="timed batches per measurement")
    parser.add_argument("--precision", default="auto", choices=hyperparams.PRECISIONS,
                        help="auto: mixed_bfloat16 on a GPU with bfloat16 units or (TensorFlow) a CPU with "
                             "bfloat16 instructions, else float32")
    parser.add_argument("--jit_compile", default="auto", choices=hyperparams.SWITCHES)
    parser.add_argument("--reference_shaped", type=int, default=1, help="also measure reference-shaped batches")
    parser.add_argument("--yardsticks", default="auto",
                        help="comma-separated yardsticks trained on the same 128-sentence batches: keras (plain "
                             "Keras 3, float32), keras_bf16 (the same in mixed_bfloat16), torch (PyTorch "
                             "nn.Transformer, skipped if not installed); none: skip; auto: keras and torch, "
                             "and keras_bf16 where this run trains in mixed_bfloat16 (on a CPU without "
                             "bfloat16 instructions it only emulates it, several times slower)")
    parser.add_argument("--iwslt_synthetic", type=int, default=0,
                        help="also measure IWSLT 2016-shaped synthetic batches and project a full run")
    return parser


def matmul_peaks(run):
    """({dtype: GFLOP/s}, the dtype the run computes in): float32's, and the run's mixed one's."""
    import keras

    peaks = {"float32": matmul_gflops("float32")}
    compute = {"mixed_bfloat16": "bfloat16", "mixed_float16": "float16"}.get(run.precision, "float32")
    if compute != "float32":
        peaks[compute] = matmul_gflops(compute)
    for dtype, value in peaks.items():
        print(f"{dtype} matmul, backend {keras.backend.backend()}: {value:.0f} GFLOP/s")
    print(f"MFU below is against the {compute} figure")
    return peaks, compute


def main(argv=None):
    parser = build_parser()
    args, hp = common.parse(parser, argv)
    hp = dataclasses.replace(hp, precision=args.precision, jit_compile=args.jit_compile, strategy="one")
    names = [] if args.yardsticks in ("none", "auto") else args.yardsticks.split(",")
    for name in names:
        if name not in yardsticks.NAMES:
            raise UserError(f"--yardsticks {args.yardsticks}: unknown {name!r}; choose from "
                            f"{', '.join(yardsticks.NAMES)} or none")
    run = devices.setup(hp)
    print(run.describe())
    if args.yardsticks == "auto":
        names = ["keras", "keras_bf16", "torch"] if run.precision == "mixed_bfloat16" else ["keras", "torch"]

    section("Matmul")
    peaks, compute = matmul_peaks(run)
    peak = peaks[compute]

    runs, vocab_size, output_ids, random_batches, sorted_batches, iwslt_plan = batches_to_measure(hp, run, args, names)

    results = {}
    for name, run_hp, vocab, ids, batches in runs:
        section(f"Train: {name} batches")
        results[name] = measure_ours(run_hp, vocab, ids, batches, args)
        report(name, results[name], peak)
    peak_mb = peak_rss_mb()  # before the yardsticks
    b = results["bucketed"]
    print(f"peak resident memory {peak_mb:.0f} MB")
    if compute != "float32":
        print(f"bucketed MFU against the float32 matmul figure instead: {b['gflops'] / peaks['float32']:.2f}")
    line = (f"train_speed preset={args.preset} tgt_tok_s={b['tgt_tok_s']:.0f} mfu={b['gflops'] / peak:.2f} "
            f"ref_shaped_tgt_tok_s={results.get('reference-shaped', {}).get('tgt_tok_s', float('nan')):.0f} "
            f"peak_rss_mb={peak_mb:.0f} precision={run.precision} "
            f"mfu_float32={b['gflops'] / peaks['float32']:.2f}")
    if names:
        line += f" sorted_tgt_tok_s={results['length-sorted']['tgt_tok_s']:.0f}"
        line += side_by_side(names, hp, vocab_size, output_ids, random_batches, sorted_batches, results, peak, args)
    if args.iwslt_synthetic:
        r = results["IWSLT 2016-shaped"]
        epoch_s = r["step_s"] * len(iwslt_plan)
        print(f"projected IWSLT 2016: {len(iwslt_plan)} steps x {r['step_s']:.3f} s = {epoch_s:.0f} s an epoch, "
              f"{hp.num_epochs} epochs {hp.num_epochs * epoch_s / 60:.1f} min (training steps only)")
        line += (f" iwslt_tgt_tok_s={r['tgt_tok_s']:.0f} iwslt_mfu={r['gflops'] / peak:.2f} "
                 f"iwslt_epoch_s={epoch_s:.0f} "
                 f"iwslt_run_min={hp.num_epochs * epoch_s / 60:.1f}")
    print(line)


if __name__ == "__main__":
    run_cli(main)

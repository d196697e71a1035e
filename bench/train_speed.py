"""Training speed, side by side in one run: the machine's matmul throughput, training throughput
with token-budget bucketed batches, and with reference-shaped batches.

    python bench/train_speed.py --preset multi30k --steps 30

Measures, through the same Keras backend:
  - fp32 matmul GFLOP/s (best of a few square sizes);
  - training after warm-up: target tokens/s, source+target tokens/s, seconds per step, training
    FLOPs per step counted from the layer shapes over the real (unpadded) tokens: 6 x weights x
    tokens for every matmul (encoder per source token, decoder and output projection per target
    token, cross-attention keys/values per source token) plus 3 x the forward attention products
    (4 x T_q x T_k x d_model per layer and sentence); achieved GFLOP/s and its ratio to the matmul
    figure (MFU); peak resident memory;
  - the same with reference-shaped batches: 128 sentences in random order, padded to the longest.
Batches come from the preset's prepro output (its train split); run prepro.py first.

The last line is machine-readable:
train_speed preset=<p> tgt_tok_s=<n> mfu=<x> ref_shaped_tgt_tok_s=<n> peak_rss_mb=<n>
"""
import os
import resource
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

import common  # noqa: E402  (bench/common.py)

import data_load  # noqa: E402
from utils import run_cli, section  # noqa: E402


def matmul_gflops(sizes=(1024, 2048, 3072), repeats=5):
    """Best fp32 matmul throughput of the backend over a few square sizes, in GFLOP/s."""
    import keras
    from keras import ops

    matmul = ops.matmul
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf
        matmul = tf.function(ops.matmul)
    best = 0.0
    for n in sizes:
        a = ops.convert_to_tensor(np.random.default_rng(0).standard_normal((n, n)).astype("float32"))
        ops.convert_to_numpy(matmul(a, a)[0, 0])  # warm up
        for _ in range(repeats):
            start = time.perf_counter()
            ops.convert_to_numpy(matmul(a, a)[0, 0])
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
    """Train on the batches twice: once untimed (every shape traced), then timed.

    Returns a dict of figures."""
    for (x, d), y in batches:
        model.train_on_batch((x, d), y)
    timed = batches
    start = time.perf_counter()
    for (x, d), y in timed:
        model.train_on_batch((x, d), y)
    seconds = time.perf_counter() - start
    src_lens = [int((x != 0).sum(1).sum()) for (x, _), _ in timed]
    tgt_lens = [int((y != 0).sum(1).sum()) for _, y in timed]
    flops = sum(training_flops(hp, vocab_size, (x != 0).sum(1), (y != 0).sum(1)) for (x, _), y in timed)
    padded = sum(x.size + y.size for (x, _), y in timed)
    return dict(seconds=seconds, steps=len(timed), tgt_tok_s=sum(tgt_lens) / seconds,
                tok_s=(sum(src_lens) + sum(tgt_lens)) / seconds, step_s=seconds / len(timed),
                gflops=flops / seconds / 1e9, flops_per_step=flops / len(timed),
                padding=1 - (sum(src_lens) + sum(tgt_lens)) / padded)


def reference_shaped(src, tgt, steps, seed, batch_size=128):
    """Batches as the reference forms them: batch_size random sentences padded to the longest."""
    rng = np.random.default_rng(seed)
    needed = steps * batch_size  # a small corpus is gone through more than once
    order = np.concatenate([rng.permutation(len(src)) for _ in range(-(-needed // len(src)))])
    return [data_load.training_arrays([src[i] for i in order[j:j + batch_size]],
                                      [tgt[i] for i in order[j:j + batch_size]])
            for j in range(0, steps * batch_size, batch_size)]


def main(argv=None):
    parser = common.parser(__doc__)
    parser.add_argument("--steps", type=int, default=30,
                        help="batches per measurement, each trained on twice: untimed (tracing), then timed")
    args, hp = common.parse(parser, argv)
    import keras

    import model as transformer

    section("Matmul")
    peak = matmul_gflops()
    print(f"fp32 matmul, backend {keras.backend.backend()}: {peak:.0f} GFLOP/s")

    section("Data")
    vocab_size = data_load.load_meta(hp.prepro_dir)["vocab_size"]
    train = data_load.TrainBatches(*data_load.load_split(hp.prepro_dir, "train"), hp.tokens_per_batch,
                                   args.seed, hp.maxlen1, hp.maxlen2)
    plan = train.plan(0)[:args.steps]
    bucketed = list(train.batches(plan))
    ref = reference_shaped(train.src, train.tgt, args.steps, args.seed)
    print(f"{args.preset}: d_model {hp.d_model}, d_ff {hp.d_ff}, {hp.num_blocks}+{hp.num_blocks} blocks, "
          f"{hp.num_heads} heads, vocab {vocab_size}; token budget {hp.tokens_per_batch}")

    results = {}
    for name, batches in (("bucketed", bucketed), ("reference-shaped", ref)):
        section(f"Train: {name} batches")
        keras.utils.set_random_seed(args.seed)
        model = transformer.compile_model(transformer.make_model(hp, vocab_size), hp)
        r = measure(model, batches, hp, vocab_size)
        results[name] = r
        print(f"{r['tgt_tok_s']:.0f} target tok/s, {r['tok_s']:.0f} source+target tok/s, {r['step_s']:.3f} s/step, "
              f"{r['flops_per_step'] / 1e9:.1f} GFLOP/step, {r['gflops']:.0f} GFLOP/s, MFU {r['gflops'] / peak:.2f}, "
              f"padding {100 * r['padding']:.0f}%", flush=True)
    peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    b = results["bucketed"]
    print(f"peak resident memory {peak_rss_mb:.0f} MB")
    print(f"train_speed preset={args.preset} tgt_tok_s={b['tgt_tok_s']:.0f} mfu={b['gflops'] / peak:.2f} "
          f"ref_shaped_tgt_tok_s={results['reference-shaped']['tgt_tok_s']:.0f} peak_rss_mb={peak_rss_mb:.0f}")


if __name__ == "__main__":
    run_cli(main)

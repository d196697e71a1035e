"""Decoding speed, side by side in one run: uncached greedy (the reference's way), cached greedy,
cached beam search.

    python bench/decode_speed.py --preset multi30k                       # fresh model, 30 tokens
    python bench/decode_speed.py --preset multi30k --ckpt log/multi30k/ckpt/E20....keras

With a checkpoint, each sentence decodes until </s> (tokens/s counts the tokens produced). With
none, a freshly initialised model of the preset's size decodes exactly --length tokens per
sentence (</s> is suppressed until then), so every method does the same number of steps. The
sources are the first --sentences of the preset's dev split (prepro.py's output), or random ids
of --source_length tokens where there is none. Cached greedy and beam search are compiled whole by
XLA once per batch shape; the warm-up does that for every shape first and prints its time, so the
timed runs measure decoding only (as a long evaluation or a training run sees it).

The last line is machine-readable:
decode_speed cached_vs_uncached=<x> beam4_vs_greedy=<x> greedy_tok_s=<n> beam4_tok_s=<n>
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

import common  # noqa: E402  (bench/common.py)

import data_load  # noqa: E402
import decoding  # noqa: E402
import hyperparams  # noqa: E402
from utils import run_cli, section  # noqa: E402


def sources(hp, n, source_length, vocab_size, seed):
    """Source id sequences: the dev split when prepro has run, else random ids."""
    if os.path.isfile(os.path.join(hp.prepro_dir, "dev.npz")):
        src, _ = data_load.load_split(hp.prepro_dir, "dev")
        print(f"sources: the first {min(n, len(src))} sentences of {hp.prepro_dir}/dev")
        return src[:n]
    print(f"sources: {n} random sentences of {source_length} tokens ({hp.prepro_dir} has no dev split)")
    rng = np.random.default_rng(seed)
    return [rng.integers(4, vocab_size, source_length).astype(np.int32) for _ in range(n)]


def run(method, model, batches, length, beam_size, alpha):
    """Decode every batch; returns (seconds, produced tokens)."""
    kw = {} if length is None else dict(max_len=length, min_len=length)
    start, tokens = time.perf_counter(), 0
    for x in batches:
        if method == "uncached":
            out = decoding.greedy_decode(model, x, cached=False, **kw)
        elif method == "cached":
            out = decoding.greedy_decode(model, x, **kw)
        else:
            out = decoding.beam_search(model, x, beam_size, alpha, **kw)
        tokens += int((out != data_load.PAD).sum())
    return time.perf_counter() - start, tokens


def main(argv=None):
    parser = common.parser(__doc__)
    parser.add_argument("--ckpt", help="trained checkpoint; default: a freshly initialised model")
    parser.add_argument("--sentences", type=int, default=256)
    parser.add_argument("--length", type=int, default=30, help="forced output length (fresh model)")
    parser.add_argument("--source_length", type=int, default=15, help="random sources' length")
    parser.add_argument("--batch_sentences", type=int, default=64, help="sentences per batch")
    parser.add_argument("--beam_size", type=int, default=4)
    parser.add_argument("--alpha", type=float, default=0.6)
    args, hp = common.parse(parser, argv)
    import keras

    import checkpoints
    import model as transformer

    section("Model")
    keras.utils.set_random_seed(args.seed)
    if args.ckpt:
        hp = hyperparams.load_hparams(os.path.dirname(os.path.dirname(os.path.abspath(args.ckpt))))
        model, length = checkpoints.load(args.ckpt, hp), None
        print(f"checkpoint {args.ckpt}: decoding until </s>")
    else:
        output_ids = None
        if os.path.isdir(hp.prepro_dir):
            vocab = data_load.load_meta(hp.prepro_dir)["vocab_size"]
            output_ids = data_load.output_ids(hp.output_vocab, data_load.load_split(hp.prepro_dir, "train")[1])
        else:
            vocab = hp.vocab_size
        model, length = transformer.make_model(hp, vocab, output_ids), args.length
        print(f"fresh {args.preset} model (d_model {hp.d_model}, {hp.num_blocks}+{hp.num_blocks} blocks, "
              f"vocab {vocab}, softmax over {model.output_size}): exactly {length} output tokens per sentence")
    src = sources(hp, args.sentences, args.source_length, model.vocab_size, args.seed)
    order = np.argsort([len(s) for s in src], kind="stable")
    batches = [data_load.encoder_inputs([src[i] for i in order[j:j + args.batch_sentences]])
               for j in range(0, len(src), args.batch_sentences)]

    section("Warm up: compile for every batch shape (timed apart)")
    shapes = list({b.shape: b for b in batches}.values())
    for method in ("uncached", "cached", "beam"):
        seconds, _ = run(method, model, shapes, length, args.beam_size, args.alpha)
        print(f"{method:8s} {len(shapes)} shapes: {seconds:.1f} s (tracing/compiling and one batch each)", flush=True)

    section(f"Decode {len(src)} sentences in {len(batches)} batches")
    results = {}
    for method in ("uncached", "cached", "beam"):
        seconds, tokens = run(method, model, batches, length, args.beam_size, args.alpha)
        results[method] = (seconds, tokens)
        name = {"uncached": "uncached greedy (reference's way)", "cached": "cached greedy",
                "beam": f"cached beam {args.beam_size}"}[method]
        print(f"{name:36s} {seconds:8.2f} s  {len(src) / seconds:8.1f} sent/s  {tokens / seconds:9.1f} tok/s",
              flush=True)
    (t_unc, _), (t_greedy, n_greedy), (t_beam, n_beam) = results["uncached"], results["cached"], results["beam"]
    print(f"decode_speed cached_vs_uncached={t_unc / t_greedy:.2f} beam{args.beam_size}_vs_greedy="
          f"{t_beam / t_greedy:.2f} greedy_tok_s={n_greedy / t_greedy:.0f} "
          f"beam{args.beam_size}_tok_s={n_beam / t_beam:.0f}")


if __name__ == "__main__":
    run_cli(main)

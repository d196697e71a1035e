"""Decoding speed, side by side in one run: uncached greedy (the reference's way), cached greedy,
cached beam search, and CTranslate2 (the fastest CPU engine for this architecture) greedy and beam
on the same weights (export.py's conversion), float32 and int8.

    python bench/decode_speed.py --preset multi30k                       # fresh model, 30 tokens
    python bench/decode_speed.py --preset multi30k --ckpt log/multi30k/ckpt/E20....keras

With a checkpoint, each sentence decodes until </s> (tokens/s counts the tokens produced). With
none, a freshly initialised model of the preset's size decodes exactly --length tokens per
sentence (</s> is suppressed until then), so every method does the same number of steps. The
sources are the first --sentences of the preset's dev split (prepro.py's output), or random ids
of --source_length tokens where there is none. Cached greedy and beam search run as --jit_compile
says: compiled whole by XLA once per batch shape (on), or as one graph traced once for every shape
(off: TensorFlow on a CPU by default); the warm-up does that for every shape first and prints its
time, so the timed runs measure decoding only (as a long evaluation or a training run sees it). CTranslate2 gets
the same batches, as pieces, with --threads threads (default: every core, as TensorFlow takes),
decoding up to the same length (1.5 T1 + 10; exactly --length with a fresh model); its beam search
scores length by length^alpha (ours: GNMT's ((5 + length) / 6)^alpha). With a checkpoint, the share
of sentences whose greedy output is the same as ours is printed: the same model, decoded elsewhere.

The last line is machine-readable:
decode_speed cached_vs_uncached=<x> beam4_vs_greedy=<x> greedy_tok_s=<n> beam4_tok_s=<n>
ct2_greedy_tok_s=<n> ct2_beam4_tok_s=<n> ct2_vs_ours_greedy=<x> ct2_vs_ours_beam4=<x> (tokens/s ratios)
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
from support.utils import optional, run_cli, section  # noqa: E402


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
    """Decode every batch; returns (seconds, produced tokens, outputs as id lists up to </s>)."""
    kw = {} if length is None else dict(max_len=length, min_len=length)
    start, tokens, outputs = time.perf_counter(), 0, []
    for x in batches:
        if method == "uncached":
            out = decoding.greedy_decode(model, x, cached=False, **kw)
        elif method == "cached":
            out = decoding.greedy_decode(model, x, **kw)
        else:
            out = decoding.beam_search(model, x, beam_size, alpha, **kw)
        tokens += int((out != data_load.PAD).sum())
        outputs += [[int(i) for i in row if i != data_load.PAD] for row in out]
    return time.perf_counter() - start, tokens, outputs


def ctranslate2_runs(model, batches, length, beam_size, alpha, quantizations, threads):
    """Time CTranslate2 on the same weights and batches: {(quantization, method): (seconds,
    tokens, outputs as id lists)}; a warm-up batch each first."""
    import tempfile

    from trained.serving import write_ctranslate2
    ctranslate2 = optional("ctranslate2", "export")

    pieces = ["<pad>", "<unk>", "<s>", "</s>"] + [f"p{i}" for i in range(4, model.vocab_size)]
    index = {p: i for i, p in enumerate(pieces)}
    sources = [[[pieces[i] for i in row if i not in (data_load.PAD, data_load.EOS)] for row in x] for x in batches]
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for quantization in quantizations:
            folder = os.path.join(tmp, quantization)
            write_ctranslate2(model, pieces, folder, None if quantization == "float32" else quantization)
            translator = ctranslate2.Translator(folder, device="cpu", intra_threads=threads, inter_threads=1)
            for method, beam in (("greedy", 1), ("beam", beam_size)):
                def decode(batch, x, translator=translator, beam=beam):
                    longest = x.shape[1] if length is None else length
                    kw = (dict(max_decoding_length=int(1.5 * longest) + 10) if length is None
                          else dict(max_decoding_length=length, min_decoding_length=length))
                    return translator.translate_batch(batch, beam_size=beam, length_penalty=alpha,
                                                      return_end_token=True, **kw)
                decode(sources[0], batches[0])  # warm-up
                start, tokens, outputs = time.perf_counter(), 0, []
                for batch, x in zip(sources, batches):
                    for result in decode(batch, x):
                        tokens += len(result.hypotheses[0])
                        outputs.append([index[p] for p in result.hypotheses[0]])
                results[quantization, method] = (time.perf_counter() - start, tokens, outputs)
    return results


def load_model(args, hp):
    """(model, forced output length or None): the --ckpt checkpoint, decoded until </s>; or a fresh
    model of the preset's size over the prepro folder's vocabulary, forced to --length tokens."""
    import keras

    from trained import checkpoints
    from trained.runs import USE_DTYPE
    import model as transformer

    keras.utils.set_random_seed(args.seed)
    if args.ckpt:
        hp = hyperparams.load_hparams(os.path.dirname(os.path.dirname(os.path.abspath(args.ckpt))))
        print(f"checkpoint {args.ckpt}: decoding until </s>")
        return checkpoints.load(args.ckpt, hp, dtype=USE_DTYPE), None  # as translate.py uses it
    output_ids = None
    if os.path.isdir(hp.prepro_dir):
        vocab = data_load.load_meta(hp.prepro_dir)["vocab_size"]
        output_ids = data_load.output_ids(hp.output_vocab, data_load.load_split(hp.prepro_dir, "train")[1])
    else:
        vocab = hp.vocab_size
    model = transformer.make_model(hp, vocab, output_ids)
    print(f"fresh {args.preset} model (d_model {hp.d_model}, {hp.num_blocks}+{hp.num_blocks} blocks, "
          f"vocab {vocab}, softmax over {model.output_size}): exactly {args.length} output tokens per sentence")
    return model, args.length


def report(name, seconds, sentences, tokens, extra=""):
    print(f"{name:36s} {seconds:8.2f} s  {sentences / seconds:8.1f} sent/s  {tokens / seconds:9.1f} tok/s{extra}",
          flush=True)


def compare_ctranslate2(model, batches, length, args, greedy_out):
    """Time CTranslate2 (ctranslate2_runs) and print its rows, with its greedy outputs' agreement
    with ours (greedy_out) where decoding runs until </s>; returns the first weight type's results
    {method: (seconds, tokens, outputs)} ({} for none)."""
    quantizations = [q.strip() for q in args.ctranslate2.split(",") if q.strip() and q.strip() != "none"]
    ct2 = ctranslate2_runs(model, batches, length, args.beam_size, args.alpha, quantizations, args.threads)
    for quantization in quantizations:
        for method in ("greedy", "beam"):
            seconds, tokens, outputs = ct2[quantization, method]
            name = f"CTranslate2 {quantization} " + ("greedy" if method == "greedy" else f"beam {args.beam_size}")
            same = ""
            if method == "greedy" and length is None:
                same = f"  same output as ours: {sum(a == b for a, b in zip(outputs, greedy_out))}/{len(outputs)}"
            report(name, seconds, sum(len(x) for x in batches), tokens, same)
    return {method: ct2[quantizations[0], method] for method in ("greedy", "beam")} if quantizations else {}


def summary_line(results, ct2, beam_size):
    """The machine-readable last line: ours, and CTranslate2's first weight type beside it."""
    (t_unc, _, _), (t_greedy, n_greedy, _), (t_beam, n_beam, _) = (results["uncached"], results["cached"],
                                                                   results["beam"])
    line = (f"decode_speed cached_vs_uncached={t_unc / t_greedy:.2f} beam{beam_size}_vs_greedy="
            f"{t_beam / t_greedy:.2f} greedy_tok_s={n_greedy / t_greedy:.0f} "
            f"beam{beam_size}_tok_s={n_beam / t_beam:.0f}")
    if ct2:
        (ct_greedy_s, ct_greedy_n, _), (ct_beam_s, ct_beam_n, _) = ct2["greedy"], ct2["beam"]
        ct_greedy, ct_beam = ct_greedy_n / ct_greedy_s, ct_beam_n / ct_beam_s
        greedy, beam = n_greedy / t_greedy, n_beam / t_beam
        line += (f" ct2_greedy_tok_s={ct_greedy:.0f} ct2_beam{beam_size}_tok_s={ct_beam:.0f} "
                 f"ct2_vs_ours_greedy={ct_greedy / greedy:.2f} ct2_vs_ours_beam{beam_size}={ct_beam / beam:.2f}")
    return line


def main(argv=None):
    parser = common.parser(__doc__)
    parser.add_argument("--ckpt", help="trained checkpoint; default: a freshly initialised model")
    parser.add_argument("--sentences", type=int, default=256)
    parser.add_argument("--length", type=int, default=30, help="forced output length (fresh model)")
    parser.add_argument("--source_length", type=int, default=15, help="random sources' length")
    parser.add_argument("--batch_sentences", type=int, default=64, help="sentences per batch")
    parser.add_argument("--beam_size", type=int, default=4)
    parser.add_argument("--alpha", type=float, default=0.6)
    parser.add_argument("--ctranslate2", default="float32,int8",
                        help="CTranslate2 weight types to time beside ours (comma-separated; none: skip)")
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="CTranslate2's threads")
    args, hp = common.parse(parser, argv)

    section("Model")
    model, length = load_model(args, hp)
    src = sources(hp, args.sentences, args.source_length, model.vocab_size, args.seed)
    order = np.argsort([len(s) for s in src], kind="stable")
    batches = [data_load.encoder_inputs([src[i] for i in order[j:j + args.batch_sentences]])
               for j in range(0, len(src), args.batch_sentences)]

    section("Warm up: compile for every batch shape (timed apart)")
    shapes = list({b.shape: b for b in batches}.values())
    for method in ("uncached", "cached", "beam"):
        seconds, _, _ = run(method, model, shapes, length, args.beam_size, args.alpha)
        print(f"{method:8s} {len(shapes)} shapes: {seconds:.1f} s (tracing/compiling and one batch each)", flush=True)

    section(f"Decode {len(src)} sentences in {len(batches)} batches")
    results = {}
    for method in ("uncached", "cached", "beam"):
        results[method] = run(method, model, batches, length, args.beam_size, args.alpha)
        name = {"uncached": "uncached greedy (reference's way)", "cached": "cached greedy",
                "beam": f"cached beam {args.beam_size}"}[method]
        report(name, results[method][0], len(src), results[method][1])
    ct2 = compare_ctranslate2(model, batches, length, args, results["cached"][2])
    print(summary_line(results, ct2, args.beam_size))


if __name__ == "__main__":
    run_cli(main)

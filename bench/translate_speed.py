"""Translating a file as a user does, beside CTranslate2: a trained run's model through the code
translate.py runs (trained.runs.Translator), its first pass (tracing and compiling included) and a
second pass over the same lines timed apart, and CTranslate2 on the same weights (export.py's
conversion) and lines, first pass (loading the converted model included) and second pass, greedy and
beam search; the ratio of the times on each row. The second passes are --repeats of each (3),
the port's and CTranslate2's alternating, so that the machine's drift reaches both alike; the table
gives their medians, and each is printed and recorded.

    python bench/translate_speed.py --logdir log/multi30k --input prepro/multi30k/test.de

The port decodes as the run's --jit_compile says, or as --jit_compile says here: loops compiled by
XLA for each batch shape (on), or one graph for every shape, traced once (off; auto: off on a CPU).
The port's first pass starts with an empty compilation cache (a fresh folder, deleted after), as a
user's first translate.py on a machine does, or with --cache run from a copy of the run's own cache
as eval.py and translate.py (and on JAX, train.py) left it: where XLA compiles, the programs
compiled for dev serve the file's batches of the same shapes (data_load.decode_batches); as one
graph, the loops an earlier process traced for the same searches are read, not traced
(support/graphs.py), as in a user's second translate.py. Its model is loaded before
the clock starts, as is CTranslate2's conversion. For each search it prints the batches, their shapes and padding, for
greedy decoding how many rows x steps whole batches run for each token written (rows that finished
early computed on until their batch ends, as with XLA; as one graph the batch shrinks,
decoding.set_aside), and for each batch shape the seconds its batches
took in each pass: the first pass's excess over the second is what that shape's program cost to
trace and compile (or to find in the cache) before it ran, or with one graph, what tracing it cost
(in the first batch's shape).

CTranslate2 decodes the pieces of each line (the port's sentencepiece model), in batches of the
run's --eval_tokens_per_batch tokens, with --threads threads, up to 256 tokens; its beam search
scores length by length^alpha (the port's: GNMT's ((5 + length) / 6)^alpha), so beam outputs may
differ where greedy ones agree. The share of lines the two translate alike is printed.

The last line is machine-readable:
translate_speed greedy_first_vs_ct2=<x> greedy_steady_vs_ct2=<x> beam_first_vs_ct2=<x> beam_steady_vs_ct2=<x>
(the port's time over CTranslate2's: below 1, the port is faster)
"""
import argparse
import contextlib
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from support import records  # noqa: E402
from support.utils import UserError, machine, optional, run_cli  # noqa: E402


def read_lines(path):
    try:
        with open(path, encoding="utf-8") as f:
            lines = [line.rstrip("\n") for line in f]
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"--input {path}: cannot be read as UTF-8 text ({e})") from None
    if not any(line.strip() for line in lines):
        raise UserError(f"--input {path}: no line to translate")
    return lines


@contextlib.contextmanager
def ctranslate2_engine(translator, lines, beam_size, threads):
    """CTranslate2 on the run's weights (export.py's conversion, in a folder deleted after): yields a
    function that translates the lines, (seconds, translations); its first call loads the converted
    model, and its seconds include that."""
    ctranslate2 = optional("ctranslate2", "export")
    import data_load
    from trained.serving import write_ctranslate2

    sp, hp = translator.sp, translator.hp
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    sources = [sp.encode(data_load.clean(line.strip()), out_type=str) for line in lines]  # cleaned as ours
    folder = tempfile.mkdtemp(prefix="ct2-")
    engine = []

    def translate():
        start = time.perf_counter()
        if not engine:
            engine.append(ctranslate2.Translator(folder, device="cpu", intra_threads=threads, inter_threads=1))
        results = engine[0].translate_batch(sources, beam_size=beam_size, length_penalty=hp.alpha,
                                            max_batch_size=hp.eval_tokens_per_batch, batch_type="tokens",
                                            max_decoding_length=256)
        outputs = [sp.decode(r.hypotheses[0]) if source else "" for r, source in zip(results, sources)]
        return time.perf_counter() - start, outputs

    try:
        write_ctranslate2(translator.model, pieces, folder)
        yield translate
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def passes(translator, lines, beam_size, threads, repeats):
    """The port's first pass over the lines, CTranslate2's (loading included), then `repeats` second
    passes of each, alternating, so that a drift of the machine's speed reaches both alike: (the
    port's seconds, first pass first; its seconds per batch, (rows, T1, seconds) each, for each pass;
    CTranslate2's seconds, first pass first; the port's translations; CTranslate2's)."""
    timed, batch_times, theirs_timed = [], [], []

    def ours_pass():
        batch_times.append([])
        start = time.perf_counter()
        out = translator.translate(lines, beam_size=beam_size, timings=batch_times[-1])
        timed.append(time.perf_counter() - start)
        return out

    ours = ours_pass()  # before CTranslate2's conversion of the weights, as a user's first translate.py
    with ctranslate2_engine(translator, lines, beam_size, threads) as ctranslate2_pass:
        seconds, theirs = ctranslate2_pass()
        theirs_timed.append(seconds)
        for _ in range(repeats):
            ours_pass()
            theirs_timed.append(ctranslate2_pass()[0])
    return timed, batch_times, theirs_timed, ours, theirs


def run_cache(logdir):
    """The folder of the run's compilation cache (support.utils.compile_cache), which must exist."""
    import dataclasses

    import hyperparams
    from support.utils import compile_cache

    folder = compile_cache(dataclasses.replace(hyperparams.load_hparams(logdir), logdir=logdir))
    if not folder or not os.path.isdir(folder):
        raise UserError(f"--cache run: {logdir} has no compilation cache ({folder}): train and evaluate it on this "
                        f"machine first, or leave --cache empty")
    return folder


def batching(translator, lines, beam_size, outputs=None):
    """How translate.py batches these lines for this search: dict of batches, shapes (distinct),
    padding (the share of the batches' source tokens that is padding) and, for greedy decoding
    given its outputs, row_steps_per_token: the decoding rows times the steps each batch ran (to its
    longest output) over the output tokens written, </s> included (1: no row ever decodes past
    its sentence's end; outputs counted in the vocabulary's pieces again)."""
    import data_load
    from trained.lines import batches as batches_of, split_long

    sp, hp = translator.sp, translator.hp
    kept = [line for line in lines if line.strip()]
    parts = [split_long(sp, data_load.clean(line.strip()), hp.maxlen1 - 1) for line in kept]
    lens = [len(ids) + 1 for pieces in parts for ids in pieces]
    batches = batches_of(translator.model, lens, hp.eval_tokens_per_batch, beam_size)
    shapes = [(len(idx), length) for idx, length in batches]  # (rows, T1) each
    found = dict(batches=len(batches), shapes=len(set(shapes)),
                 padding=round(1 - sum(lens) / sum(rows * t1 for rows, t1 in shapes), 3))
    if beam_size == 1 and outputs is not None and all(len(pieces) == 1 for pieces in parts):
        out = [len(sp.encode(text)) + 1 for line, text in zip(lines, outputs) if line.strip()]  # (sentences,)
        steps = sum(len(idx) * max(out[i] for i in idx) for idx, _ in batches)
        found["row_steps_per_token"] = round(steps / sum(out), 2)
    return found


def shape_times(first, again):
    """Each batch shape's seconds in the two passes, from translate's timings of each (lists of
    (rows, T1, seconds), the same batches in the same order): a list of dict(rows, length, batches,
    first_s, again_s), in the order the shapes were first decoded."""
    if [b[:2] for b in first] != [b[:2] for b in again]:
        raise AssertionError("the two passes batched the lines differently")
    shapes = {}
    for (rows, length, seconds), (_, _, later) in zip(first, again):
        shape = shapes.setdefault((rows, length), dict(rows=rows, length=length, batches=0, first_s=0.0, again_s=0.0))
        shape["batches"] += 1
        shape["first_s"] += seconds
        shape["again_s"] += later
    return [dict(s, first_s=round(s["first_s"], 2), again_s=round(s["again_s"], 2)) for s in shapes.values()]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--logdir", required=True, help="a trained run's folder (train.py's --logdir)")
    p.add_argument("--input", required=True, help="a text file, a sentence a line")
    p.add_argument("--beam_sizes", default="1,4", help="the searches to time, comma-separated (1: greedy)")
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="CTranslate2's threads (default: every core)")
    p.add_argument("--repeats", type=int, default=3,
                   help="second passes of each search, the port's and CTranslate2's alternating; the table gives "
                        "their medians (default 3)")
    p.add_argument("--record", metavar="PATH", help="also write the figures as a record (support/records.py) "
                                                    "to this JSON file; bench/tables.py draws tables from such files")
    p.add_argument("--cache", choices=("empty", "run"), default="empty",
                   help="the compilation cache the port's first pass starts from: empty (default: as on a machine "
                        "that never compiled them), or a copy of the run's own (as eval.py and translate.py left "
                        "it: compiled programs, or the loops traced as one graph)")
    p.add_argument("--jit_compile", choices=("on", "off", "auto"),
                   help="how the port's decoding loops run (default: the run's --jit_compile): on, compiled by "
                        "XLA for each batch shape; off, one graph for every shape")
    p.add_argument("--precision", choices=("float32", "mixed_bfloat16"),
                   help="the precision the port translates in (default: translate.py's, float32, whatever the run "
                        "trained in; trained.runs.USE_DTYPE)")
    p.add_argument("--beam_stop", choices=("bound", "finished"),
                   help="when the port's beam search ends a sentence (default: the run's; CTranslate2 ends it once "
                        "beam_size hypotheses have finished, as 'finished' does)")
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error(f"--repeats {args.repeats}: give 1 or more")
    try:
        beams = [int(b) for b in args.beam_sizes.split(",") if b.strip()]
    except ValueError:
        p.error(f"--beam_sizes {args.beam_sizes!r}: give whole numbers separated by commas, e.g. 1,4")
    lines = read_lines(args.input)
    cache = tempfile.mkdtemp(prefix="compile-cache-")  # empty: the first pass compiles
    try:
        if args.cache == "run":
            shutil.copytree(run_cache(args.logdir), cache, dirs_exist_ok=True)
        from trained.runs import Translator

        start = time.perf_counter()
        given = {name: getattr(args, name) for name in ("beam_stop", "jit_compile") if getattr(args, name)}
        translator = Translator(args.logdir, compile_cache=cache, **given)
        if args.precision and args.precision != translator.model.dtype_policy.name:
            import model as transformer
            translator.model = transformer.rebuild(translator.model, dtype=args.precision)
        loops = "xla" if translator.model.xla_decoding else "graph"
        loaded = time.perf_counter() - start
        print(f"Machine: {machine()}")
        print(f"{args.logdir}: {translator.ckpt}, precision {translator.model.compute_dtype}, loaded in "
              f"{loaded:.1f} s; {args.input}: {len(lines)} lines; decoding loops "
              + ("compiled by XLA for each batch shape" if loops == "xla" else "run as one graph for every batch shape")
              + f"; beam search ends a sentence as --beam_stop {translator.hp.beam_stop} says")
        rows, summary, figures = [], {}, dict(logdir=args.logdir, input=args.input, lines=len(lines),
                                              beam_stop=translator.hp.beam_stop, threads=args.threads,
                                              loops=loops, cache=args.cache, repeats=args.repeats, searches=[])
        for beam in beams:
            timed, batch_times, theirs_timed, ours, theirs = passes(translator, lines, beam, args.threads, args.repeats)
            first, again = timed[0], statistics.median(timed[1:])
            steady = statistics.median(theirs_timed[1:])
            batched = batching(translator, lines, beam, ours)
            batched["shapes_timed"] = shape_times(batch_times[0], [
                (n, length, statistics.median(b[i][2] for b in batch_times[1:]))
                for i, (n, length, _) in enumerate(batch_times[1])])
            print(f"{'greedy' if beam == 1 else f'beam {beam}'}: {batched['batches']} batches in {batched['shapes']} "
                  f"shapes (rows x source length), {batched['padding']:.0%} of their source tokens padding"
                  + (f"; rows x steps {batched['row_steps_per_token']:.2f} times the tokens written"
                     if "row_steps_per_token" in batched else ""))
            for s in batched["shapes_timed"]:
                print(f"  {s['rows']} x {s['length']}: {s['batches']} batch{'es' if s['batches'] > 1 else ''}, "
                      f"first pass {s['first_s']:.2f} s, again {s['again_s']:.2f} s, "
                      f"first pass's excess {s['first_s'] - s['again_s']:.2f} s")
            alike = sum(a == b for a, b in zip(ours, theirs))
            name = "greedy" if beam == 1 else f"beam {beam}"
            if args.repeats > 1:
                print(f"  second passes, ours: {', '.join(f'{t:.2f}' for t in timed[1:])} s; CTranslate2's: "
                      f"{', '.join(f'{t:.2f}' for t in theirs_timed[1:])} s (medians in the table)")
            rows.append(f"| {name} | {first:.2f} | {again:.2f} | {theirs_timed[0]:.2f} | {steady:.2f} | "
                        f"{first / theirs_timed[0]:.2f} | {again / steady:.2f} | {alike} of {len(lines)} |")
            figures["searches"].append(dict(beam_size=beam, ours_first_s=round(first, 2), ours_again_s=round(again, 2),
                                            ct2_first_s=round(theirs_timed[0], 2), ct2_again_s=round(steady, 2),
                                            ours_again_each_s=[round(t, 2) for t in timed[1:]],
                                            ct2_again_each_s=[round(t, 2) for t in theirs_timed[1:]],
                                            lines_alike=alike, **batched))
            key = "greedy" if beam == 1 else "beam"
            summary[f"{key}_first_vs_ct2"], summary[f"{key}_steady_vs_ct2"] = first / theirs_timed[0], again / steady
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    print("\n| search | ours, first pass (s) | ours, again (s) | CTranslate2, first (s) | CTranslate2, again (s) | "
          "first: ours / CTranslate2 | again: ours / CTranslate2 | lines alike |")
    print("|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    if args.record:
        records.write(args.record, records.make("translate_speed", figures, translator.model.compute_dtype))
        print(f"wrote the figures to {args.record}")
    print("translate_speed " + " ".join(f"{k}={v:.2f}" for k, v in summary.items()))
    return 0


if __name__ == "__main__":
    run_cli(main)

"""The cost of --subword_sampling per epoch: the seeded BPE-dropout that training uses
(data_load.resegmenter) beside sentencepiece's own sampling (which does not repeat across
processes), on the training text of a prepro folder, both sides, side by side in one run.

    python bench/sampling_speed.py --prepro_dir prepro/multi30k

The last line is machine-readable:
sampling_speed seeded_s=<s> sentencepiece_s=<s> ratio=<x> (seconds per epoch, median of --epochs)
"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import data_load  # noqa: E402
from support.utils import run_cli  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prepro_dir", default="prepro/multi30k", help="prepro.py's output folder")
    parser.add_argument("--alpha", type=float, default=0.1, help="the probability of skipping a merge")
    parser.add_argument("--epochs", type=int, default=3, help="epochs segmented by each")
    args = parser.parse_args(argv)
    sp = data_load.load_vocab(args.prepro_dir)
    meta = data_load.load_meta(args.prepro_dir)
    texts = [data_load.load_text(args.prepro_dir, "train", meta[side]) for side in ("src_lang", "tgt_lang")]
    resegment = data_load.resegmenter(sp, *texts, args.alpha, seed=0)
    seeded, theirs = [], []
    for epoch in range(args.epochs):
        start = time.perf_counter()
        resegment(epoch)
        seeded.append(time.perf_counter() - start)
        start = time.perf_counter()
        for side in texts:
            sp.encode(side, enable_sampling=True, alpha=args.alpha, nbest_size=-1, num_threads=1)
        theirs.append(time.perf_counter() - start)
        print(f"epoch {epoch + 1}: seeded {seeded[-1]:.2f} s, sentencepiece {theirs[-1]:.2f} s "
              f"({sum(map(len, texts))} sentences)")
    a, b = statistics.median(seeded), statistics.median(theirs)
    print(f"sampling_speed seeded_s={a:.3f} sentencepiece_s={b:.3f} ratio={a / b:.2f}")


if __name__ == "__main__":
    run_cli(main)

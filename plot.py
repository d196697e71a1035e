"""Draw how a training run went: loss, dev BLEU and learning rate per epoch, as a PNG.

    python plot.py --preset multi30k            # writes log/multi30k/history.png
    python plot.py --logdir log/en-fr --output run.png
    python plot.py log/multi30k                 # the log directory as an argument works too

Reads <logdir>/history.jsonl (one JSON line an epoch, written by train.py, which also draws this
picture at the end of every run). TensorBoard (`tensorboard --logdir <logdir>/tensorboard`) shows
the same figures live while a run trains.
"""
import argparse
import os

import hyperparams
from pictures import plot_history, read_history
from utils import run_cli


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog="Writes a PNG; the figures come from <logdir>/history.jsonl.")
    parser.add_argument("run", nargs="?", metavar="LOGDIR", help="a training run's folder (as --logdir)")
    parser.add_argument("--preset", default="sample", choices=sorted(hyperparams.PRESETS),
                        help="the run of this preset (its --logdir) unless a log directory is given")
    parser.add_argument("--logdir", metavar="PATH", help="a training run's folder (holding history.jsonl)")
    parser.add_argument("--output", metavar="PATH", help="the PNG to write (default: <logdir>/history.png)")
    args = parser.parse_args(argv)
    logdir = args.run or args.logdir or hyperparams.preset(args.preset).logdir
    epochs = read_history(os.path.join(logdir, "history.jsonl"))
    print(f"wrote {plot_history(epochs, args.output or os.path.join(logdir, 'history.png'))} "
          f"({len(epochs)} epochs)")


if __name__ == "__main__":
    run_cli(main)

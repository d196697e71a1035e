"""Draw how a training run went: loss, dev BLEU and learning rate per epoch, as a PNG; or several
runs in one picture, to compare them.

    python plot.py --preset multi30k            # writes log/multi30k/history.png
    python plot.py --logdir log/en-fr --output run.png
    python plot.py log/multi30k                 # the log directory as an argument works too
    python plot.py log/a log/b --labels base "no positions" --output compare.png

Reads <logdir>/history.jsonl (one JSON line an epoch, written by train.py, which also draws the
one-run picture at the end of every run). Several runs: a colour for each run, train solid and dev
dashed. TensorBoard (`tensorboard --logdir <logdir>/tensorboard`) shows the same figures live while
a run trains.
"""
import argparse
import os

import hyperparams
from pictures import plot_runs, read_history
from utils import UserError, run_cli


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog="Writes a PNG; the figures come from <logdir>/history.jsonl.")
    parser.add_argument("runs", nargs="*", metavar="LOGDIR", help="training runs' folders (as --logdir)")
    parser.add_argument("--preset", default="sample", choices=sorted(hyperparams.PRESETS),
                        help="the run of this preset (its --logdir) unless a log directory is given")
    parser.add_argument("--logdir", metavar="PATH", help="a training run's folder (holding history.jsonl)")
    parser.add_argument("--labels", nargs="+", metavar="NAME",
                        help="a name for each run in the legend (default: the folders as given)")
    parser.add_argument("--output", metavar="PATH",
                        help="the PNG to write (default for one run: <logdir>/history.png; several runs need it)")
    args = parser.parse_args(argv)
    logdirs = args.runs + ([args.logdir] if args.logdir else []) or [hyperparams.preset(args.preset).logdir]
    if args.labels and len(args.labels) != len(logdirs):
        raise UserError(f"--labels: {len(args.labels)} names for {len(logdirs)} runs; give one name for each run")
    if len(logdirs) > 1 and not args.output:
        raise UserError(f"{len(logdirs)} runs make one picture: say where it goes with --output PATH.png")
    histories = [read_history(os.path.join(logdir, "history.jsonl")) for logdir in logdirs]
    if len(logdirs) == 1:
        runs = [(args.labels[0] if args.labels else None, histories[0])]
    else:
        runs = list(zip(args.labels or logdirs, histories))
    output = plot_runs(runs, args.output or os.path.join(logdirs[0], "history.png"))
    print(f"wrote {output} ({', '.join(f'{len(epochs)} epochs' for epochs in histories)})")


if __name__ == "__main__":
    run_cli(main)

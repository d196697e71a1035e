"""Draw how a training run went: loss, dev BLEU and learning rate per epoch, as a PNG; or several
runs in one picture, to compare them.

    python plot.py --preset multi30k            # writes log/multi30k/history.png
    python plot.py --logdir log/en-fr --output run.png
    python plot.py log/multi30k                 # the log directory as an argument works too
    python plot.py log/a log/b --labels base "no positions" --output compare.png
    python plot.py log/a log/b --table           # the same figures as a Markdown table, epoch by epoch

Reads <logdir>/history.jsonl (one JSON line an epoch, written by train.py, which also draws the
one-run picture at the end of every run). Several runs: a colour for each run, train solid and dev
dashed. TensorBoard (`tensorboard --logdir <logdir>/tensorboard`) shows the same figures live while
a run trains.
"""
import argparse
import os

import hyperparams
from support.pictures import plot_runs, read_history
from support.utils import UserError, run_cli


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog="Writes a PNG (with --table, prints a table); the figures come from "
                                            "<logdir>/history.jsonl.")
    parser.add_argument("runs", nargs="*", metavar="LOGDIR", help="training runs' folders (as --logdir)")
    parser.add_argument("--preset", default="sample", choices=sorted(hyperparams.PRESETS),
                        help="the run of this preset (its --logdir) unless a log directory is given")
    parser.add_argument("--logdir", metavar="PATH", help="a training run's folder (holding history.jsonl)")
    parser.add_argument("--labels", nargs="+", metavar="NAME",
                        help="a name for each run in the legend or the table (default: the folders as given)")
    parser.add_argument("--output", metavar="PATH",
                        help="the PNG to write (default for one run: <logdir>/history.png; several runs need it)")
    parser.add_argument("--table", action="store_true",
                        help="print the runs' figures as a Markdown table (an epoch a row) instead of drawing them")
    parser.add_argument("--columns", default="train_loss,dev_loss,dev_bleu", metavar="KEYS",
                        help="with --table: the history.jsonl keys to show for each run (default %(default)s; "
                             "dev_bleu_reference is the BLEU the reference's way)")
    args = parser.parse_args(argv)
    logdirs = args.runs + ([args.logdir] if args.logdir else []) or [hyperparams.preset(args.preset).logdir]
    if args.labels and len(args.labels) != len(logdirs):
        raise UserError(f"--labels: {len(args.labels)} names for {len(logdirs)} runs; give one name for each run")
    if len(logdirs) > 1 and not args.output and not args.table:
        raise UserError(f"{len(logdirs)} runs make one picture: say where it goes with --output PATH.png")
    histories = [read_history(os.path.join(logdir, "history.jsonl")) for logdir in logdirs]
    runs = list(zip(args.labels or logdirs, histories))
    if args.table:
        print(markdown_table(runs, args.columns.split(",")), end="")
        return
    if len(runs) == 1 and not args.labels:
        runs = [(None, histories[0])]  # one unnamed run: a colour for each series, as train.py draws it
    output = plot_runs(runs, args.output or os.path.join(logdirs[0], "history.png"))
    print(f"wrote {output} ({', '.join(f'{len(epochs)} epochs' for epochs in histories)})")


def markdown_table(runs, keys):
    """[(label, epochs)] as a Markdown table: an epoch a row, a column for each run and key; an
    epoch a run did not reach, or a key its history lacks, is blank."""
    absent = [key for key in keys if not any(key in e for _, epochs in runs for e in epochs)]
    if absent:
        raise UserError(f"--columns: no run's history has {', '.join(absent)}; keys of the first: "
                        f"{', '.join(runs[0][1][0])}")
    numbers = sorted({e["epoch"] for _, epochs in runs for e in epochs})
    by_epoch = [{e["epoch"]: e for e in epochs} for _, epochs in runs]
    header = ["epoch"] + [f"{label} {key}" for label, _ in runs for key in keys]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for number in numbers:
        cells = [str(number)]
        for epochs in by_epoch:
            for key in keys:
                value = epochs.get(number, {}).get(key)
                cells.append("" if value is None else f"{value:.2f}" if "bleu" in key else f"{value:.3f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    run_cli(main)

"""Time to quality: for each trained run given, the minutes of training it took to reach each dev
BLEU of --thresholds and its final figures, read from the run's own history.jsonl, the runs side by
side in one table with the machine and each run's precision in its header.

    python bench/time_to_quality.py log/multi30k log/multi30k_new --labels today new

A run's clock is train.py's: each epoch's elapsed_seconds counts from its process's start, so the
minutes to a threshold are those of the epochs before it plus that process's clock (a resumed run's
earlier processes counted whole). Its dev BLEU is the one train.py scores after each epoch
(sacreBLEU of greedy translations of --eval_sentences dev sentences; the run's hparams.json says how
many). The final figures are its last epoch's, and the newest dev result eval.py wrote, if it did
(its file's name: the checkpoint, the decoding and sacreBLEU of the final model, after any
averaging, with the run's decoding).
Compare runs trained on the same machine with nothing else running.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the project's modules

from support import records  # noqa: E402
from support.pictures import read_history, wall_seconds  # noqa: E402
from support.utils import UserError, machine, run_cli  # noqa: E402


def minutes_to(history, threshold):
    """The training minutes until the first epoch whose dev BLEU reaches threshold (None: never):
    the whole clock of every train.py process before it, and its own process's clock at it."""
    done = 0.0
    for h, after in zip(history, history[1:] + [None]):
        if h["dev_bleu"] >= threshold:
            return (done + h["elapsed_seconds"]) / 60
        if after is not None and after["elapsed_seconds"] < h["elapsed_seconds"]:  # a new process
            done += h["elapsed_seconds"]
    return None


def evaluated(logdir):
    """eval.py's newest dev result in the run folder (results/dev_<checkpoint>[_beam<K>a<alpha>]B<sacreBLEU>.txt)
    as its name without .txt, or None."""
    folder = os.path.join(logdir, "results")
    found = [os.path.join(folder, name) for name in os.listdir(folder) if name.startswith("dev_")
             and name.endswith(".txt")] if os.path.isdir(folder) else []
    return os.path.basename(max(found, key=os.path.getmtime))[:-len(".txt")] if found else None


def run_figures(logdir, label, thresholds):
    """What the table shows of one run: its precision, epochs, minutes in all and to each threshold
    (None: not reached), last epoch's dev BLEU and eval.py's newest dev result (None: not run)."""
    history = read_history(os.path.join(logdir, "history.jsonl"))
    if not history:
        raise UserError(f"{logdir}: history.jsonl holds no epoch yet: train it first")
    return dict(label=label, logdir=logdir,
                precision=" then ".join(dict.fromkeys(h.get("precision", "?") for h in history)),  # in order
                epochs=len(history), minutes=wall_seconds(history) / 60,
                minutes_to={f"{t:g}": minutes_to(history, t) for t in thresholds},
                last_dev_bleu=history[-1]["dev_bleu"], eval_dev=evaluated(logdir))


def table(runs, machine_text):
    """The markdown table of the runs (run_figures' dicts), a row a run, and its header lines."""
    thresholds = list(runs[0]["minutes_to"])
    columns = ["run", "precision", "epochs", "training minutes",
               *(f"minutes to dev BLEU {t}" for t in thresholds), "last epoch's dev BLEU", "eval.py on dev"]
    lines = [f"Machine: {machine_text}", "",
             "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for run in runs:
        cells = [run["label"], run["precision"], str(run["epochs"]), f"{run['minutes']:.1f}",
                 *("not reached" if m is None else f"{m:.1f}" for m in run["minutes_to"].values()),
                 f"{run['last_dev_bleu']:.2f}", run["eval_dev"] or "not run"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None):
    import argparse
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", help="run folders (train.py's --logdir), each with its history.jsonl")
    p.add_argument("--labels", nargs="+", help="a name for each run (default: its folder)")
    p.add_argument("--thresholds", default="30,35,40", help="the dev BLEU figures to time, comma-separated")
    p.add_argument("--record", metavar="PATH", help="also write the figures as a record (support/records.py) "
                                                    "for bench/tables.py to draw in docs/results.md")
    args = p.parse_args(argv)
    labels = args.labels or args.runs
    if len(labels) != len(args.runs):
        p.error(f"--labels: {len(labels)} names for {len(args.runs)} runs")
    try:
        thresholds = [float(t) for t in args.thresholds.split(",") if t.strip()]
    except ValueError:
        p.error(f"--thresholds {args.thresholds!r}: give numbers separated by commas, e.g. 30,35,40")
    runs = [run_figures(logdir, label, thresholds) for logdir, label in zip(args.runs, labels)]
    print(table(runs, machine()))
    if args.record:
        precision = ", ".join(dict.fromkeys(run["precision"] for run in runs))
        records.write(args.record, records.make("time_to_quality", dict(thresholds=thresholds, runs=runs), precision))
        print(f"wrote the figures to {args.record}")
    return 0


if __name__ == "__main__":
    run_cli(main)

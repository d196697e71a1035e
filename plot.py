"""Draw how a training run went: loss, dev BLEU and learning rate per epoch, as a PNG.

    python plot.py log/multi30k                 # writes log/multi30k/history.png
    python plot.py log/multi30k --output run.png

Reads <logdir>/history.jsonl (one JSON line an epoch, written by train.py, which also draws this
picture at the end of every run). TensorBoard (`tensorboard --logdir <logdir>/tensorboard`) shows
the same figures live while a run trains.
"""
import argparse
import json
import os

from utils import UserError, atomic_write, run_cli

# The panels: (title, [(history key, label)]); a key absent from every line is left out.
PANELS = (
    ("loss", [("train_loss", "train (label-smoothed)"), ("dev_loss", "dev")]),
    ("dev BLEU", [("dev_bleu", "sacreBLEU"), ("dev_bleu_reference", "the reference's way")]),
    ("learning rate (end of epoch)", [("lr", "lr")]),
)


def read_history(path):
    """The epochs of a history.jsonl as a list of dicts; a UserError naming the line of a bad one."""
    epochs = []
    try:
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    epochs.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise UserError(f"{path}:{lineno}: not a JSON line ({e.msg}); was the file cut off? "
                                    f"delete that line and draw again") from None
    except FileNotFoundError:
        raise UserError(f"{path}: no training history; train first (python train.py ...) or pass the "
                        f"--logdir of a training run") from None
    if not epochs:
        raise UserError(f"{path}: no epoch finished yet; draw it after the first epoch")
    return epochs


def plot_history(epochs, output):
    """Write the panels of PANELS for epochs (read_history) to the PNG file output."""
    import matplotlib
    matplotlib.use("Agg")  # files only: no screen needed
    import matplotlib.pyplot as plt

    panels = [(title, [(key, label) for key, label in series if any(key in e for e in epochs)])
              for title, series in PANELS]
    panels = [(title, series) for title, series in panels if series]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 3.6), squeeze=False)
    for ax, (title, series) in zip(axes[0], panels):
        for key, label in series:
            points = [(e["epoch"], e[key]) for e in epochs if e.get(key) is not None]
            ax.plot(*zip(*points), marker="o", markersize=3, label=label)
        ax.set_title(title)
        ax.set_xlabel("epoch")
        ax.grid(alpha=0.3)
        if len(series) > 1:
            ax.legend()
    fig.tight_layout()
    with atomic_write(output) as tmp:
        fig.savefig(tmp, dpi=100, format="png")
    plt.close(fig)
    return output


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog="Writes a PNG; the figures come from <logdir>/history.jsonl.")
    parser.add_argument("logdir", help="a training run's folder (holding history.jsonl)")
    parser.add_argument("--output", metavar="PATH", help="the PNG to write (default: <logdir>/history.png)")
    args = parser.parse_args(argv)
    epochs = read_history(os.path.join(args.logdir, "history.jsonl"))
    print(f"wrote {plot_history(epochs, args.output or os.path.join(args.logdir, 'history.png'))} "
          f"({len(epochs)} epochs)")


if __name__ == "__main__":
    run_cli(main)

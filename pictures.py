"""Pictures a person reads: how a training run went (loss, dev BLEU, learning rate per epoch; several
runs in one picture to compare them) and what a model attends to (runs.attention_maps), as PNG
files. plot.py and attention.py are their command lines; train.py redraws <logdir>/history.png
after every epoch. Figures are drawn on matplotlib's Figure, not through pyplot, so that no backend
is chosen or switched (a notebook that imports these keeps its own).
"""
import json
import math

from utils import UserError, atomic_write

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
    return plot_runs([(None, epochs)], output)


def plot_runs(runs, output):
    """Write the panels of PANELS for several runs, [(label, epochs)], to the PNG file output: a
    colour for each run, a line style for each series (solid the first, dashed the second). One run
    with label None: a colour for each series, as plot_history draws it."""
    from matplotlib.figure import Figure  # not pyplot: no backend to choose, none switched for a notebook

    panels = [(title, [(key, label) for key, label in series if any(key in e for _, epochs in runs for e in epochs)])
              for title, series in PANELS]
    panels = [(title, series) for title, series in panels if series]
    fig = Figure(figsize=(4.5 * len(panels), 3.6 if len(runs) == 1 else 4.2))
    axes = fig.subplots(1, len(panels), squeeze=False)
    for ax, (title, series) in zip(axes[0], panels):
        for run, (name, epochs) in enumerate(runs):
            for number, (key, label) in enumerate(series):
                points = [(e["epoch"], e[key]) for e in epochs if e.get(key) is not None]
                if not points:
                    continue
                style = {} if name is None else dict(color=f"C{run % 10}", linestyle=("-", "--", ":")[number % 3])
                ax.plot(*zip(*points), marker="o", markersize=3, label=label if name is None else f"{name}: {label}",
                        **style)
        ax.set_title(title)
        ax.set_xlabel("epoch")
        ax.grid(alpha=0.3)
        if len(series) > 1 or len(runs) > 1:
            ax.legend(fontsize="small" if len(runs) > 1 else None)
    fig.tight_layout()
    with atomic_write(output) as tmp:
        fig.savefig(tmp, dpi=100, format="png")
    return output


CLIPPED_BEYOND = 12.0  # BLEU: plot_ablations cuts bars longer than this at the axis's edge


def plot_ablations(rows, output):
    """A bar per ablation row (ablate.summarize): its dev BLEU difference to the baseline, with the
    margin its verdict's rule needs as an error bar (none with one seed), in full colour where the
    verdict is better or worse and pale where it needs more seeds, written to the PNG file output.
    A bar longer than CLIPPED_BEYOND ends at the axis's edge with its value on it."""
    from matplotlib.figure import Figure

    names = [n for n, row in rows.items() if row["verdict"] != "the baseline"]
    base = next(row for row in rows.values() if row["verdict"] == "the baseline")
    differences = [rows[n]["difference"] for n in names]
    noise = [rows[n]["margin"] if math.isfinite(rows[n]["margin"]) else 0.0 for n in names]
    full, pale = {"better": "tab:green", "worse": "tab:red"}, {"better": "#a6dba0", "worse": "#f4a582"}
    colors = [(full if rows[n]["verdict"] in full else pale).get(rows[n]["verdict"].split()[0], "tab:gray")
              for n in names]
    # A difference far beyond the others (a row that breaks training) would squeeze them to
    # nothing: the axis ends past the others, and such a bar ends at its edge with its value on it.
    limit = 1.15 * max([abs(d) + n for d, n in zip(differences, noise) if abs(d) <= CLIPPED_BEYOND] + [2.0])
    fig = Figure(figsize=(7, 0.35 * len(names) + 1.4))
    ax = fig.subplots()
    shown = [max(-limit, min(limit, d)) for d in differences]
    ax.barh(range(len(names)), shown, xerr=[0.0 if s != d else n for s, d, n in zip(shown, differences, noise)],
            color=colors, capsize=3)
    for y, (s, d) in enumerate(zip(shown, differences)):
        if s != d:
            ax.text(s * 0.97, y, f"{d:+.1f} (bar cut)", va="center", ha="left" if d < 0 else "right", color="white",
                    fontsize=8, fontweight="bold")
    ax.set_xlim(-limit if min(shown) < 0 else -0.1 * limit, limit if max(shown) > 0 else 0.1 * limit)
    ax.set_yticks(range(len(names)), names, fontsize=8)
    ax.invert_yaxis()
    ax.axvline(0.0, color="black", linewidth=0.8)
    ax.set_xlabel(f"dev BLEU minus the baseline's ({base['beam']:.2f}); error bars: the rule's margin")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    with atomic_write(output) as tmp:
        fig.savefig(tmp, dpi=90, format="png")
    return output


def draw_attention(maps, sentence, translation, output):
    """A grid of heatmaps, a row per layer and a column per head, written to the PNG file output."""
    from matplotlib.figure import Figure

    rows, heads = len(maps), maps[0][1].shape[0]
    size = max(max(len(r), len(c)) for _, _, r, c in maps)
    cell = max(2.4, 0.22 * size)
    fig = Figure(figsize=(cell * heads + 1, cell * rows + 1.2))
    axes = fig.subplots(rows, heads, squeeze=False)
    for (title, weights, row_pieces, column_pieces), axes_row in zip(maps, axes):
        for head, ax in enumerate(axes_row):
            ax.imshow(weights[head], cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
            ax.set_xticks(range(len(column_pieces)), column_pieces, rotation=90, fontsize=7)
            ax.set_yticks(range(len(row_pieces)), row_pieces, fontsize=7)
            ax.set_title(f"{title}, head {head + 1}", fontsize=8)
    fig.suptitle(f"{sentence}\n→ {translation}", fontsize=10)
    fig.tight_layout()
    with atomic_write(output) as tmp:
        fig.savefig(tmp, dpi=90, format="png")
    return output

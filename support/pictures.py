"""Pictures a person reads: how a training run went (loss, dev BLEU, learning rate per epoch; several
runs in one picture to compare them) and what a model attends to (runs.attention_maps), as PNG
files. plot.py and attention.py are their command lines; train.py redraws <logdir>/history.png
as epochs end. Figures are drawn on matplotlib's Figure, not through pyplot, so that no backend
is chosen or switched (a notebook that imports these keeps its own).
"""
import json
import math
import re
import sys
import typing
import warnings

from support.utils import UserError, atomic_write

# The panels: (title, [(history key, label)]); a key absent from every line is left out.
PANELS = (
    ("loss", [("train_loss", "train (label-smoothed)"), ("dev_loss", "dev")]),
    ("dev BLEU", [("dev_bleu", "sacreBLEU"), ("dev_bleu_reference", "the reference's way")]),
    ("learning rate (end of epoch)", [("lr", "lr")]),
)


def wall_seconds(history):
    """The wall time a run took: each epoch's elapsed_seconds counts from its train.py process's
    start, so a resumed run's clock restarts, and the time is the sum of each process's last."""
    ends = [h["elapsed_seconds"] for h, after in zip(history, history[1:] + [None])
            if after is None or after["elapsed_seconds"] < h["elapsed_seconds"]]
    return sum(ends)


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
    ax.set_xlim(-limit if min(shown, default=0) < 0 else -0.1 * limit,  # none shown: the preset's runs alone
                limit if max(shown, default=0) > 0 else 0.1 * limit)
    ax.set_yticks(range(len(names)), names, fontsize=8)
    ax.invert_yaxis()
    ax.axvline(0.0, color="black", linewidth=0.8)
    ax.set_xlabel(f"dev BLEU minus the baseline's ({base['beam']:.2f}); error bars: the rule's margin")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    with atomic_write(output) as tmp:
        fig.savefig(tmp, dpi=90, format="png")
    return output


def draw_attention(maps, sentence, translation, output, average_heads=False, mark_largest=False):
    """Heatmaps of attention weights (runs.attention_maps), written to the PNG file output: a row
    per layer and a column per head, or with average_heads one heatmap per layer, side by side,
    of its heads' mean weights. mark_largest circles each row's largest weight (in cross-attention,
    the source piece an output piece leaned on most: the alignment). One colour scale, 0 to 1."""
    from matplotlib.figure import Figure

    if average_heads:
        maps = [(f"{title}, mean of {weights.shape[0]} heads", weights.mean(0, keepdims=True), rows, columns)
                for title, weights, rows, columns in maps]
    if average_heads:  # one row of panels, one per map
        panels = [[(title, weights[0], rows, columns) for title, weights, rows, columns in maps]]
    else:  # a row per map, a panel per head
        panels = [[(f"{title}, head {head + 1}", weights[head], rows, columns) for head in range(weights.shape[0])]
                  for title, weights, rows, columns in maps]
    size = max(max(len(r), len(c)) for _, _, r, c in maps)
    grid = (len(panels), len(panels[0]))
    cell = min(max(2.6, 0.3 * size), 12.0 / grid[1])  # pieces readable, the whole at most about 13 inches wide
    fig = Figure(figsize=(cell * grid[1] + 1.4, cell * grid[0] + 1.4), layout="constrained")
    axes = fig.subplots(*grid, squeeze=False)
    for panel_row, axes_row in zip(panels, axes):
        for (title, weights, rows, columns), ax in zip(panel_row, axes_row):
            image = ax.imshow(weights, cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
            ax.set_xticks(range(len(columns)), columns, rotation=90, fontsize=9)
            ax.set_yticks(range(len(rows)), rows, fontsize=9)
            ax.set_title(title, fontsize=9)
            if mark_largest:
                ax.scatter(weights.argmax(-1), range(len(rows)), s=60, facecolors="none", edgecolors="red",
                           linewidths=1.2)
    fig.colorbar(image, ax=axes, shrink=0.6, label="attention weight")
    fig.suptitle(f"{sentence}\n→ {translation}", fontsize=10)
    save_noting_missing_glyphs(fig, output)
    return output


def save_noting_missing_glyphs(fig, output):
    """fig as a PNG file; characters the font cannot draw (Chinese, emoji: drawn as boxes) told in one
    note on stderr instead of one warning each."""
    with warnings.catch_warnings(record=True) as caught, atomic_write(output) as tmp:
        warnings.simplefilter("always")
        fig.savefig(tmp, dpi=90, format="png")
    missing = set()
    for w in caught:
        glyph = re.match(r"Glyph \d+ \((.*)\) missing from font", str(w.message))
        if glyph:
            missing.add(glyph.group(1))
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    if missing:
        print(f"note: {output}: the font has no glyph for {len(missing)} character(s) of the text, drawn as "
              f"boxes; install a font that has them (e.g. Debian's fonts-noto-cjk, fonts-noto-color-emoji)",
              file=sys.stderr)


# draw_architecture's colours, by kind of box (those of the paper's Figure 1, roughly)
BOX_COLOURS = {"attention": "#fcd9b0", "feed_forward": "#c9dcf0", "norm": "#f5f2c0", "embedding": "#f6cfcf",
               "position": "#e4e4e4", "output": "#d7ead3", "data": "white"}


class Box(typing.NamedTuple):
    column: str
    kind: str
    text: str
    mask: str | None = None
    roles: tuple = ()


def architecture(model):
    """The boxes of the model as it was built, bottom to top, each a Box: column "encoder" or
    "decoder", kind (its colour), text, mask (where an attention's mask enters, or None), roles: what
    the drawing connects to it ("residual from": a residual path leaves at this box's input,
    "residual to": it is added back here, "memory": the encoder's output, "keys from memory": a
    cross-attention)."""
    d, f, h, positions = model.d_model, model.d_ff, model.num_heads, model.positional
    shared = "shared" if model.source_embedding is None else "own"
    boxes = []
    for column, t, blocks in (("encoder", "T1", model.encoder_blocks), ("decoder", "T2", model.decoder_blocks)):
        ids = "source ids" if column == "encoder" else "target ids, shifted right (<s> first)"
        boxes.append(Box(column, "data", f"{ids}  (N, {t})"))
        boxes.append(Box(column, "embedding", f"embedding ({shared}) × √d_model  (N, {t}, {d})"))
        boxes.append(Box(column, "position", f"+ positional encoding: {positions}"))
        for block in blocks:
            for sublayer in block.SUBLAYERS:
                add_norm = getattr(block, f"{sublayer}_norm")
                if sublayer == "feed_forward":
                    text, mask = f"{block.name}.feed_forward  {d} → {f} → {d}", None
                else:
                    text = f"{block.name}.{sublayer}  ({h} heads)"
                    mask = {"self_attention": "mask: source padding" if column == "encoder"
                            else "mask: causal + target padding",
                            "cross_attention": "mask: source padding"}[sublayer]
                kind = "attention" if sublayer != "feed_forward" else "feed_forward"
                cross = ("keys from memory",) if sublayer == "cross_attention" else ()
                if add_norm.position == "pre":
                    boxes.append(Box(column, "norm", "layer norm", None, ("residual from",)))
                    boxes.append(Box(column, kind, text, mask, cross))
                    boxes.append(Box(column, "norm", "+ residual", None, ("residual to",)))
                else:
                    boxes.append(Box(column, kind, text, mask, ("residual from", *cross)))
                    boxes.append(Box(column, "norm", "+ residual, layer norm", None, ("residual to",)))
        if column == "encoder":
            if model.encoder_norm is not None:
                boxes.append(Box(column, "norm", "layer norm"))
            boxes.append(Box(column, "data", f"memory: the encoder's output  (N, T1, {d})", None, ("memory",)))
    if model.decoder_norm is not None:
        boxes.append(Box("decoder", "norm", "layer norm"))
    boxes.append(Box("decoder", "output", f"linear: embedding matrixᵀ → logits  (N, T2, {model.output_size})"))
    boxes.append(Box("decoder", "output", "softmax: P(next token)"))
    return boxes


def draw_architecture(model, output):
    """The model as built (architecture(model)), encoder left and decoder right, as in the paper's
    Figure 1 but with every block drawn: each sublayer's box, its residual path, where each
    attention's mask enters, the encoder's output feeding every cross-attention. Written to the PNG
    file output."""
    from matplotlib.figure import Figure
    from matplotlib.patches import FancyBboxPatch

    boxes = architecture(model)
    rows = {c: [b for b in boxes if b.column == c] for c in ("encoder", "decoder")}
    height = max(len(r) for r in rows.values())
    centre, width, step = {"encoder": 2.6, "decoder": 8.4}, 4.4, 1.0
    fig = Figure(figsize=(9.5, 0.5 * height + 0.8))
    ax = fig.subplots()
    place = {}  # column: [(y, box)]
    for column, column_boxes in rows.items():
        x = centre[column]
        for row, box in enumerate(column_boxes):
            y = row * step
            place.setdefault(column, []).append((y, box))
            ax.add_patch(FancyBboxPatch((x - width / 2, y - 0.3), width, 0.6, boxstyle="round,pad=0.02",
                                        fc=BOX_COLOURS[box.kind], ec="black", lw=0.8))
            ax.text(x, y + (0.12 if box.mask else 0.0), box.text, ha="center", va="center", fontsize=8)
            if box.mask:  # where the attention's mask enters
                ax.text(x, y - 0.16, box.mask, ha="center", va="center", fontsize=7, style="italic",
                        color="firebrick")
            if row:
                ax.annotate("", xy=(x, y - 0.3), xytext=(x, y - step + 0.3), arrowprops=dict(arrowstyle="->", lw=0.8))
    for column, placed in place.items():  # residual paths: from a sublayer's input around it to its sum
        x, side = centre[column], -1 if column == "encoder" else 1
        edge = x + side * width / 2
        for i, (y, box) in enumerate(placed):
            if "residual from" in box.roles:
                start = y - step + 0.3  # the arrow into this box
                end = next(yy for yy, later in placed[i + 1:] if "residual to" in later.roles)
                bend = edge + side * 0.35
                ax.plot([x, bend, bend], [start + 0.2, start + 0.2, end], color="gray", lw=0.9)
                ax.annotate("", xy=(edge, end), xytext=(bend, end), arrowprops=dict(arrowstyle="->", color="gray",
                                                                                   lw=0.9))
    memory = next(y for y, box in place["encoder"] if "memory" in box.roles)
    crosses = [y for y, box in place["decoder"] if "keys from memory" in box.roles]
    bus = (centre["encoder"] + centre["decoder"]) / 2
    ax.plot([centre["encoder"] + width / 2, bus, bus], [memory, memory, max(crosses)], color="navy", lw=1.0)
    ax.plot([bus, bus], [min(crosses), memory], color="navy", lw=1.0)
    for y in crosses:
        ax.annotate("", xy=(centre["decoder"] - width / 2, y), xytext=(bus, y),
                    arrowprops=dict(arrowstyle="->", color="navy", lw=1.0))
    ax.text(bus, max(memory, max(crosses)) + 0.45, "keys and values\nfrom the memory", ha="center", fontsize=7,
            color="navy")
    for column, title in (("encoder", "encoder"), ("decoder", "decoder")):
        ax.text(centre[column], (height - 0.2) * step, title, ha="center", fontsize=11, fontweight="bold")
    ax.set_xlim(-0.2, 11.2)
    ax.set_ylim(-0.6, height * step + 0.2)
    ax.axis("off")
    fig.tight_layout()
    with atomic_write(output) as tmp:
        fig.savefig(tmp, dpi=90, format="png")
    return output


def draw_beam_tree(steps, finished, output):
    """Beam search, step by step, as a tree written to the PNG file output.

    Args:
      steps: a list per step of the open hypotheses after it, each (piece, log-probability, the row
        of the hypothesis it extends in the step before (None: the start), on the returned path).
      finished: the hypotheses that ended with </s>, each (step, the row it extends in the step
        before, log-probability, length penalty, on the returned path); their score is the
        log-probability over the penalty.
    The returned translation's path is drawn in red."""
    from matplotlib.figure import Figure

    rows = max(len(open_) for open_ in steps)
    below = {}  # finished hypotheses drawn under the open ones, a row each per step
    fig = Figure(figsize=(1.05 * (len(steps) + 1) + 0.8, 0.75 * (rows + 2) + 0.6))
    ax = fig.subplots()

    def node(x, y, text, best):
        ax.text(x, y, text, ha="center", va="center", fontsize=8, color="firebrick" if best else "black",
                fontweight="bold" if best else "normal",
                bbox=dict(boxstyle="round", fc="#fde0dd" if best else "white", ec="firebrick" if best else "gray"))

    def edge(step, parent, y, best):
        start = (step, 0) if parent is None else (step, -parent)
        ax.plot([start[0] + 0.3, step + 0.7], [start[1], y], color="firebrick" if best else "gray",
                linewidth=2.0 if best else 0.8, zorder=0)

    node(0, 0, "<s>", True)
    for t, open_ in enumerate(steps):
        for row, (piece, score, parent, best) in enumerate(open_):
            if piece is None:
                continue
            node(t + 1, -row, f"{piece}\n{score:.2f}", best)
            edge(t, parent, -row, best)
    for step, parent, score, penalty, best in finished:
        y = -rows - below.setdefault(step, 0) - 0.2
        below[step] += 1
        node(step + 1, y, f"</s>\n{score:.2f} / {penalty:.2f}\n= {score / penalty:.2f}", best)
        edge(step, parent, y, best)
    ax.set(xlim=(-0.6, len(steps) + 0.6), ylim=(-rows - max(below.values(), default=0) - 0.5, 0.6))
    ax.set_title("open hypotheses: piece and log-probability; under them, those ended by </s>: "
                 "log-probability / length penalty = score", fontsize=9)
    ax.axis("off")
    fig.tight_layout()
    with atomic_write(output) as tmp:
        fig.savefig(tmp, dpi=90, format="png")
    return output

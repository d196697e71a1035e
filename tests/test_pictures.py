"""plot.py (a run's history as a PNG) and attention.py (attention weights as heatmaps)."""
import json

import numpy as np

from conftest import assert_one_line_error, run_script

PNG = b"\x89PNG\r\n\x1a\n"


def test_plot_draws_a_history(tmp_path):
    epochs = [{"epoch": e, "train_loss": 5.0 / e, "dev_loss": 5.5 / e, "dev_bleu": 3.0 * e,
               "dev_bleu_reference": 2.9 * e, "lr": 1e-3 / e} for e in range(1, 5)]
    (tmp_path / "history.jsonl").write_text("".join(json.dumps(e) + "\n" for e in epochs))
    run = run_script("plot.py", str(tmp_path))
    assert run.returncode == 0, run.stderr[-2000:]
    assert (tmp_path / "history.png").read_bytes().startswith(PNG)
    assert "4 epochs" in run.stdout
    again = run_script("plot.py", "--logdir", str(tmp_path), "--output", str(tmp_path / "b.png"))
    assert again.returncode == 0 and (tmp_path / "b.png").read_bytes().startswith(PNG)
    # a cut-off last line is named with its number
    with open(tmp_path / "history.jsonl", "a") as f:
        f.write('{"epoch": 5, "train_lo')
    assert_one_line_error(run_script("plot.py", str(tmp_path)), r"history\.jsonl:5: not a JSON line")
    assert_one_line_error(run_script("plot.py", str(tmp_path / "none")), r"none/history\.jsonl: no training history")



def test_plot_draws_several_runs_in_one_picture(tmp_path, monkeypatch):
    """Runs to compare: one picture, a legend entry per run and series; a run without a BLEU
    column (another program's history) still draws its losses."""
    for name, scale in (("a", 1.0), ("b", 1.2)):
        (tmp_path / name).mkdir()
        epochs = [{"epoch": e, "train_loss": scale * 5.0 / e, "dev_loss": scale * 5.5 / e,
                   **({"dev_bleu_reference": 2.9 * e} if name == "a" else {})} for e in range(1, 4)]
        (tmp_path / name / "history.jsonl").write_text("".join(json.dumps(e) + "\n" for e in epochs))
    runs = [str(tmp_path / "a"), str(tmp_path / "b")]
    out = tmp_path / "both.png"
    run = run_script("plot.py", *runs, "--labels", "ours", "reference", "--output", str(out))
    assert run.returncode == 0, run.stderr[-2000:]
    assert out.read_bytes().startswith(PNG) and "3 epochs, 3 epochs" in run.stdout
    from support.pictures import plot_runs, read_history
    import matplotlib.figure
    drawn, savefig = [], matplotlib.figure.Figure.savefig
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig",
                        lambda fig, *a, **k: drawn.append(fig) or savefig(fig, *a, **k))
    plot_runs([("ours", read_history(runs[0] + "/history.jsonl")),
               ("reference", read_history(runs[1] + "/history.jsonl"))], str(tmp_path / "c.png"))
    legends = [[t.get_text() for t in ax.get_legend().get_texts()] for ax in drawn[0].axes]
    assert legends == [["ours: train (label-smoothed)", "ours: dev", "reference: train (label-smoothed)",
                        "reference: dev"], ["ours: the reference's way"]]
    table = run_script("plot.py", *runs, "--labels", "ours", "reference", "--table", "--columns",
                       "dev_loss,dev_bleu_reference")
    assert table.returncode == 0, table.stderr[-2000:]
    assert table.stdout.splitlines()[:3] == [
        "| epoch | ours dev_loss | ours dev_bleu_reference | reference dev_loss | reference dev_bleu_reference |",
        "|---|---|---|---|---|", "| 1 | 5.500 | 2.90 | 6.600 |  |"]
    assert_one_line_error(run_script("plot.py", *runs, "--table", "--columns", "bleu"),
                          r"--columns: no run's history has bleu")
    assert_one_line_error(run_script("plot.py", *runs), r"2 runs make one picture: .*--output")
    assert_one_line_error(run_script("plot.py", *runs, "--labels", "x", "--output", str(out)),
                          r"--labels: 1 names for 2 runs")

def test_training_draws_its_history(quick_start):
    runs = quick_start.runs
    assert runs[1].returncode == 0, runs[1].stderr[-2000:]
    picture, history = quick_start.log / "history.png", quick_start.log / "history.jsonl"
    assert picture.read_bytes().startswith(PNG)
    # drawn after the last epoch's line (its drawings between are at most every REDRAW_SECONDS)
    assert picture.stat().st_mtime_ns >= history.stat().st_mtime_ns


def test_attention_maps_are_the_models_weights(quick_start):
    """Every layer and head of the cross-attention: rows sum to 1, one row per output piece, one
    column per source piece; the encoder's self-attention; the decoder's, causal."""
    from trained.runs import Translator, attention_maps
    translator = Translator(str(quick_start.log))
    source, output, translation, maps = attention_maps(translator, "Ein Mann fährt Fahrrad.", encoder=True,
                                                       decoder_self=True)
    m = translator.model
    assert len(maps) == 3 * len(m.decoder_blocks)
    assert source[-1] == "</s>" and translation == translator.translate("Ein Mann fährt Fahrrad.")
    for _, weights, rows, columns in maps:
        assert weights.shape == (m.num_heads, len(rows), len(columns))
        np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-5)
    rows = [len(r) for _, _, r, _ in maps]
    assert rows == [len(output)] * len(m.decoder_blocks) + [len(source)] * len(m.encoder_blocks) + \
        [len(output)] * len(m.decoder_blocks)
    for _, weights, rows, columns in maps[-len(m.decoder_blocks):]:
        assert columns[0] == "<s>" and columns[1:] == rows[:-1]  # what the decoder read at each step
        assert np.triu(weights, 1).max() == 0.0  # no output piece attended to a later one


def test_attention_script_writes_a_png(quick_start, tmp_path):
    dirs = quick_start.dirs
    run = run_script("attention.py", *dirs, "--output", str(tmp_path / "a.png"), "Ein Mann fährt Fahrrad.")
    assert run.returncode == 0, run.stderr[-2000:]
    assert (tmp_path / "a.png").read_bytes().startswith(PNG)
    assert run.stdout.splitlines()[0]  # the translation
    assert_one_line_error(run_script("attention.py", *dirs, "--output", str(tmp_path / "no" / "a.png"), "Hallo."),
                          r"no/a\.png: its folder .* does not exist")


def test_an_ablation_bar_far_beyond_the_others_is_cut_with_its_value_written(tmp_path, monkeypatch):
    import matplotlib.figure

    from support.pictures import plot_ablations
    drawn, savefig = [], matplotlib.figure.Figure.savefig
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig",
                        lambda fig, *a, **k: drawn.append(fig) or savefig(fig, *a, **k))
    rows = {"preset": dict(verdict="the baseline", beam=41.5, margin=0.0, difference=0.0),
            "broken": dict(verdict="worse", beam=3.4, margin=0.2, difference=-38.1),
            "small": dict(verdict="worse on 2 seeds: needs more", beam=40.0, margin=0.9, difference=-1.5),
            "beam": dict(verdict="better", beam=41.9, margin=0.3, difference=0.4),
            "one_seed": dict(verdict="one seed: no spread to judge by yet", beam=41.0, margin=float("inf"),
                             difference=-0.5)}
    plot_ablations(rows, str(tmp_path / "a.png"))
    ax = drawn[0].axes[0]
    left, right = ax.get_xlim()
    assert -5 < left < -2 and 2 <= right < 5  # the small bars fill the axis
    assert [t.get_text() for t in ax.texts] == ["-38.1 (bar cut)"]
    assert (tmp_path / "a.png").read_bytes().startswith(PNG)
    # the preset's runs alone (ablate.py --table recipes before any recipe has trained): an empty chart
    plot_ablations({"preset": rows["preset"]}, str(tmp_path / "b.png"))
    assert (tmp_path / "b.png").read_bytes().startswith(PNG)


def test_the_architecture_pairs_every_residual_and_feeds_every_cross_attention(tmp_path):
    """architecture(model): each sublayer's residual path leaves below it and is added back above it,
    in post- and pre-norm alike; the memory feeds one cross-attention per decoder block; and the
    picture is drawn."""
    import dataclasses

    import hyperparams
    import model as transformer
    from support import pictures

    for norm in ("post", "pre"):
        hp = dataclasses.replace(hyperparams.preset("sample"), norm=norm, num_blocks=2)
        boxes = pictures.architecture(transformer.make_model(hp, vocab_size=30))
        for column, sublayers in (("encoder", 2 * 2), ("decoder", 3 * 2)):
            roles = [box.roles for box in boxes if box.column == column]
            ends = ["residual from" if "residual from" in r else "residual to" for r in roles
                    if {"residual from", "residual to"} & set(r)]
            assert ends == ["residual from", "residual to"] * sublayers, (norm, column, ends)
            kinds = [box.kind for box in boxes if box.column == column]
            assert kinds.count("attention") + kinds.count("feed_forward") == sublayers
        crosses = [box for box in boxes if "keys from memory" in box.roles]
        assert len(crosses) == 2 and all(".cross_attention" in box.text for box in crosses)
        assert [box.column for box in boxes if "memory" in box.roles] == ["encoder"]
        assert pictures.draw_architecture(transformer.make_model(hp, vocab_size=30), tmp_path / f"{norm}.png")
        assert (tmp_path / f"{norm}.png").stat().st_size > 10000

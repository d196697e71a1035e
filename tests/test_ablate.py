"""ablate.py's bookkeeping on the sample preset, one epoch a run: an interrupted run resumes, the
table and its picture are written (a section written by hand below it kept), and a second call
trains and evaluates nothing again; its verdict rule on made-up figures."""
import json
import os
import re
import shutil
import signal

import numpy as np
import pytest

import ablate
import hyperparams
from ablate import RECIPES, RECIPES_BASE, TABLE_BASE, VARIANTS, summarize, verdict
from support.pictures import wall_seconds
from support.utils import UserError
from conftest import ROOT, bench_module, run_script

# one epoch of the sample in 24 batches, a checkpoint every 5 steps (one to resume from), a model of one
# block a side (the bookkeeping does not depend on its size)
EXTRA = ["--num_epochs", "1", "--tokens_per_batch", "256", "--save_every_steps", "5", "--eval_sentences", "5",
         "--d_model", "32", "--d_ff", "64", "--num_blocks", "1", "--num_heads", "2"]


@pytest.mark.slow
def test_ablate_resumes_skips_what_is_done_and_writes_the_table(quick_start, tmp_path):
    runs, table = tmp_path / "runs", tmp_path / "ablations.md"
    common = ["--preset", "sample", "--only", "pre_norm,no_length_penalty", "--seeds", "1", "--runs", str(runs),
              "--output", str(table), *EXTRA, "--prepro_dir", str(quick_start.prepro)]
    interrupted = runs / "pre_norm" / "seed1"
    killed = run_script("tests/interrupted_train.py", "10", "train.py", "--preset", "sample", "--logdir",
                        str(interrupted), "--seed", "1", "--norm", "pre", *EXTRA,
                        "--prepro_dir", str(quick_start.prepro))
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    first = run_script("ablate.py", *common)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "resuming from" in first.stdout and "epoch 2, batch" not in first.stdout
    text = table.read_text(encoding="utf-8")
    rows = [line.split("|") for line in text.splitlines() if line.startswith(("| preset", "| pre_norm", "| no_length"))]
    assert len(rows) == 3 and "`--norm pre`" in rows[1][3] and "the baseline" in rows[0][-3]
    assert rows[1][-3].strip() == "one seed: no spread to judge by yet"
    # the row that decodes the preset's run another way: no minutes of its own, a paired bootstrap p
    assert rows[2][8].strip() == "" and rows[0][8].strip() and 0 < float(rows[2][-2]) <= 1
    assert "ablations.png" in text and (tmp_path / "ablations.png").stat().st_size > 1000
    assert re.search(r"CPU family \S+, \d+ cores, with(out)? bfloat16 instructions, with(out)? AMX\), in "
                     r"(float32|mixed_bfloat16); each run's figures, with its machine, date and commit, are in "
                     r"\[ablations\.json\]\(ablations\.json\)\.", text), text[:2000]
    scores = json.loads((interrupted / "ablation.json").read_text())
    decoded = ablate.decoding_key(ablate.run_settings(hyperparams.load_hparams(str(interrupted))))  # the preset's
    assert scores["epochs"] == 1 and list(scores["evals"]) == [decoded]
    assert set(scores["evals"][decoded]) == {"beam", "loss", "hypotheses"}  # each from eval.py
    again = run_script("ablate.py", *common)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "train.py" not in again.stdout and "BLEU dev" not in again.stdout  # nothing trained or scored
    assert json.loads((interrupted / "ablation.json").read_text()) == scores
    assert os.path.getsize(table) > 0
    # the ledger beside the table: each run's figures (not its translations, which stay with the run);
    # a run recorded there is neither trained nor scored again where its folder is gone (another
    # machine, another session), and the table is the same
    ledger = json.loads((tmp_path / "ablations.json").read_text())
    assert sorted(ledger) == ["pre_norm/seed1", "preset/seed1"]
    assert ledger["pre_norm/seed1"]["evals"] == {decoded: {k: v for k, v in scores["evals"][decoded].items()
                                                           if k != "hypotheses"}}
    no_penalty = ablate.decoding_key(ledger["preset/seed1"]["hparams"], ["--alpha", "0"])
    assert no_penalty == decoded.replace("--alpha 0.6", "--alpha 0")
    assert 0 < ledger["preset/seed1"]["evals"][no_penalty]["bootstrap"] <= 1
    assert ledger["preset/seed1"]["evals"][no_penalty]["against"] == decoded
    assert ledger["pre_norm/seed1"]["settings"] == [*EXTRA, "--prepro_dir", str(quick_start.prepro)]
    before = table.read_text(encoding="utf-8")
    shutil.rmtree(runs)
    elsewhere = run_script("ablate.py", *common)
    assert elsewhere.returncode == 0, elsewhere.stderr[-3000:]
    assert "train.py" not in elsewhere.stdout and "BLEU dev" not in elsewhere.stdout
    assert table.read_text(encoding="utf-8") == before
    own = "## Written by hand\n\nKept when the table is written again.\n"
    table.write_text(table.read_text(encoding="utf-8") + "\n" + own, encoding="utf-8")
    report = run_script("ablate.py", *common[:3], "pre_norm,no_positions", *common[4:], "--report")
    assert report.returncode == 0, report.stderr[-3000:]
    assert "train.py" not in report.stdout and "not trained yet" in report.stdout
    text = table.read_text(encoding="utf-8")
    assert "| pre_norm |" in text and "| no_positions |" not in text
    assert "Runs not finished yet: 1 of the 3 the table trains;" in text
    assert "python ablate.py --preset sample --only" in text
    assert text.endswith("|\n\n" + own) and text.count("## Written by hand") == 1  # the document's own section
    bad = run_script("ablate.py", "--only", "no_such_row", "--runs", str(runs))
    assert bad.returncode == 2 and "unknown variant no_such_row" in bad.stderr


def test_a_third_seed_is_trained_only_where_the_rule_asks_for_it(monkeypatch, tmp_path):
    """Two seeds a row; a row whose difference passes on two seeds gets seed 3, and the preset with
    it; a row within the seeds' variation does not (measure is replaced by made-up figures)."""
    beams = {"preset": [41.4, 41.6, 41.5], "no_positions": [34.1, 34.3, 34.2], "pre_norm": [41.2, 41.9, 41.3]}
    trained = []

    def measure(preset, variant, seed, runs, extra, ledger, report_only=False, table="ablations"):
        trained.append((variant, seed))
        return dict(beam=beams[variant][seed - 1], greedy=40.0, loss=2.6, minutes=30.0, precision="float32",
                    commit="abc1234", date="2026-11-28", machine="a CPU")
    monkeypatch.setattr(ablate, "measure", measure)
    table = tmp_path / "ablations.md"
    ablate.main(["--only", "no_positions,pre_norm", "--output", str(table)])
    assert trained == [("preset", 1), ("preset", 2), ("no_positions", 1), ("no_positions", 2), ("pre_norm", 1),
                       ("pre_norm", 2), ("preset", 3), ("no_positions", 3)]
    rows = {line.split("|")[1].strip(): line.split("|") for line in table.read_text().splitlines()
            if line.startswith("| ") and not line.startswith("| row")}
    assert rows["no_positions"][4].strip() == "3" and rows["no_positions"][-3].strip() == "worse"
    assert rows["pre_norm"][4].strip() == "2" and rows["pre_norm"][-3].strip() == WITHIN
    assert "once per seed (1, 2; 3 too where the rule asks for more)" in table.read_text()
    assert "Runs not finished" not in table.read_text()
    trained.clear()
    ablate.main(["--only", "no_positions", "--more_seeds", "", "--output", str(table)])
    assert trained == [("preset", 1), ("preset", 2), ("no_positions", 1), ("no_positions", 2)]
    assert "worse on 2 seeds: needs more" in table.read_text()


class Stop(Exception):
    """Raised where ablate.py would run a script (stop_scripts)."""


def stop_scripts(monkeypatch):
    """ablate.run_script replaced: each call is kept in the list returned ((script, args)), then Stop."""
    calls = []

    def run_script(script, args):
        calls.append((script, args))
        raise Stop

    monkeypatch.setattr(ablate, "run_script", run_script)
    return calls


def test_a_run_trains_the_recipe_its_table_measures_then_its_row(monkeypatch, tmp_path):
    """multi30k's tables measure the recipe the preset had before it took linear_12 (the ablations
    at 12 epochs, the last epoch's weights): each run's train.py gets that first, then the row's own
    settings (which win), then the settings given to every run."""
    calls = stop_scripts(monkeypatch)
    with pytest.raises(Stop):
        ablate.measure("multi30k", "longer_averaged", 1, str(tmp_path), ["--precision", "float32"],
                       dict(path=str(tmp_path / "ledger.json"), runs={}))
    script, args = calls[0]
    assert script == "train.py" and args[args.index("--seed") + 2:] == [
        *TABLE_BASE["multi30k"][0], "--num_epochs", "20", "--precision", "float32"]
    hp = hyperparams.parse_args("t", args)[0]
    assert (hp.num_epochs, hp.average_last, hp.lr_decay, hp.precision) == (20, 1, "rsqrt", "float32")
    with pytest.raises(Stop):
        ablate.measure("multi30k", "linear_8", 1, str(tmp_path), ["--precision", "float32"],
                       dict(path=str(tmp_path / "ledger.json"), runs={}), table="recipes")
    script, args = calls[1]
    assert script == "train.py"
    assert args[args.index("--seed") + 2:] == [*RECIPES_BASE["multi30k"][0], *RECIPES["linear_8"][0],
                                               "--precision", "float32"]
    # the preset is now the recipe linear_12 (the tables decode with the stopping rule it had then), and
    # its old recipe is the recipes table's preset row
    _, _, command = ablate.run_command("multi30k", "linear_12", 1, "runs", [], "recipes")
    assert hyperparams.changed(hyperparams.parse_args("t", command)[0], hyperparams.preset("multi30k")).keys() \
        == {"logdir", "seed", "beam_stop"}
    assert ablate.differences(ablate.run_settings(hyperparams.parse_args("t", command)[0]),
                              ablate.run_settings(hyperparams.preset("multi30k", logdir="runs/linear_12/seed1",
                                                                     seed=1))) == ""
    _, _, command = ablate.run_command("multi30k", "preset", 1, "runs", [], "recipes")
    old = hyperparams.parse_args("t", command)[0]
    assert (old.num_epochs, old.average_last, old.lr_decay, old.lr) == (20, 5, "rsqrt", 1e-3)
    # the current table: the preset as it is, decoding included, and a row's own settings on top of it
    _, _, command = ablate.run_command("multi30k", "preset", 1, "runs", [], "current")
    assert hyperparams.changed(hyperparams.parse_args("t", command)[0], hyperparams.preset("multi30k")).keys() \
        == {"logdir", "seed"}
    logdir, name, command = ablate.run_command("multi30k", "pre_norm", 2, "runs", [], "current")
    assert (logdir, name) == (os.path.join("runs", "pre_norm", "seed2"), "pre_norm/seed2")
    changes = hyperparams.changed(hyperparams.parse_args("t", command)[0], hyperparams.preset("multi30k"))
    assert set(changes) == {"logdir", "seed", "norm"} and changes["norm"][0] == "pre"


def test_a_run_of_other_settings_than_its_row_is_not_counted_as_the_row(monkeypatch, tmp_path):
    """After the preset (or a row) changed: a finished run folder that trained other settings is
    refused with the settings that differ, and a ledger entry of other settings is trained again;
    one of the same settings is taken as recorded."""
    calls = stop_scripts(monkeypatch)
    runs, ledger = str(tmp_path / "runs"), dict(path=str(tmp_path / "ledger.json"), runs={})
    logdir = os.path.join(runs, "pre_norm", "seed1")
    hyperparams.save_hparams(hyperparams.preset("sample", norm="pre", num_epochs=1, lr=5e-4, seed=1, logdir=logdir),
                             logdir)
    with open(os.path.join(logdir, "history.jsonl"), "w", encoding="utf-8") as f:
        f.write(json.dumps(dict(epoch=1, dev_bleu=1.0, elapsed_seconds=60.0)) + "\n")
    with pytest.raises(UserError, match=r"trained other settings than pre_norm/seed1 trains now \(--lr 0.0005 "
                                        r"\(now [\d.e-]+\)\): move that folder away"):
        ablate.measure("sample", "pre_norm", 1, runs, ["--num_epochs", "1"], ledger)
    assert calls == []
    # the same settings: the finished run counts (eval.py is what runs next)
    with pytest.raises(Stop):
        ablate.measure("sample", "pre_norm", 1, runs, ["--num_epochs", "1", "--lr", "5e-4"], ledger)
    assert calls.pop()[0] == "eval.py"
    # the ledger: a run of the row's settings is taken as recorded, one of other settings trains again
    command = ["--preset", "sample", "--logdir", "x", "--seed", "2", "--norm", "pre", "--num_epochs", "1"]
    figures = dict(greedy=1.0, epochs=1, minutes=1.0, evals={"as trained": dict(beam=2.0, loss=3.0)})
    ledger["runs"]["pre_norm/seed2"] = dict(figures, preset="sample", settings=["--num_epochs", "1"],
                                            hparams=ablate.run_settings(hyperparams.parse_args("", command)[0]))
    assert ablate.measure("sample", "pre_norm", 2, runs, ["--num_epochs", "1"], ledger)["beam"] == 2.0
    assert calls == []
    ledger["runs"]["pre_norm/seed2"]["hparams"]["lr"] = 5e-4
    with pytest.raises(Stop):
        ablate.measure("sample", "pre_norm", 2, runs, ["--num_epochs", "1"], ledger)
    assert calls.pop()[0] == "train.py"


def test_a_run_decoded_otherwise_is_the_same_run_decoded_again(monkeypatch, tmp_path):
    """Settings that only decode (the preset's new stopping rule, say) are not training: a finished run
    folder of the old rule is decoded again with the row's whole decoding given to eval.py, not refused;
    a ledger entry keyed the old way ("as trained", or only a row's own options) counts where it names
    the row's decoding, and is trained again where it does not and its checkpoints are not here."""
    calls = stop_scripts(monkeypatch)
    runs, ledger = str(tmp_path / "runs"), dict(path=str(tmp_path / "ledger.json"), runs={})
    logdir = os.path.join(runs, "pre_norm", "seed1")
    hyperparams.save_hparams(hyperparams.preset("sample", norm="pre", num_epochs=1, seed=1, logdir=logdir,
                                                beam_size=4, beam_stop="bound", alpha=1.0), logdir)
    with open(os.path.join(logdir, "history.jsonl"), "w", encoding="utf-8") as f:
        f.write(json.dumps(dict(epoch=1, dev_bleu=1.0, elapsed_seconds=60.0)) + "\n")
    extra = ["--num_epochs", "1", "--beam_size", "4", "--beam_stop", "finished"]
    assert ablate.differences(ablate.run_settings(hyperparams.load_hparams(logdir)), ablate.run_settings(
        hyperparams.preset("sample", norm="pre", num_epochs=1, seed=1, beam_size=4))) == ""
    with pytest.raises(Stop):
        ablate.measure("sample", "pre_norm", 1, runs, extra, ledger)
    script, args = calls.pop()
    assert script == "eval.py" and args[args.index("--split") + 2:] == [
        "--beam_size", "4", "--alpha", "0.6", "--beam_stop", "finished", "--average_last", "1"]
    # the ledger, the run's folder elsewhere: figures recorded under the old key of the same decoding count
    command = ["--preset", "sample", "--logdir", "x", "--seed", "2", "--norm", "pre", *extra]
    settings = ablate.run_settings(hyperparams.parse_args("", command)[0])
    figures = dict(greedy=1.0, epochs=1, minutes=1.0, evals={"as trained": dict(beam=2.0, loss=3.0)})
    ledger["runs"]["pre_norm/seed2"] = dict(figures, preset="sample", settings=extra, hparams=settings)
    assert ablate.measure("sample", "pre_norm", 2, runs, extra, ledger)["beam"] == 2.0
    assert calls == []
    # recorded with the exact rule: the same training, but no figures of the row's decoding, and no
    # checkpoints here to decode again from
    ledger["runs"]["pre_norm/seed2"]["hparams"] = dict(settings, beam_stop="bound")
    assert ablate.measure("sample", "pre_norm", 2, runs, extra, ledger, report_only=True) is None
    with pytest.raises(Stop):
        ablate.measure("sample", "pre_norm", 2, runs, extra, ledger)
    assert calls.pop()[0] == "train.py"
    ledger["runs"]["pre_norm/seed2"]["evals"]["--beam_stop finished"] = dict(beam=4.0, loss=3.0)  # a row's key
    assert ablate.measure("sample", "pre_norm", 2, runs, extra, ledger)["beam"] == 4.0
    assert calls == []
    # a paired bootstrap counts only against the preset's decoding as it is now: one recorded before
    # "against" was kept was against the run's own decoding then (here the exact rule)
    ledger["runs"]["preset/seed2"] = dict(figures, preset="sample", settings=extra, hparams=dict(
        settings, beam_stop="bound", norm="post"), evals={"--beam_stop finished": dict(beam=4.0, loss=3.0),
                                                         "--beam_stop finished --alpha 0": dict(beam=3.0, loss=3.0,
                                                                                                bootstrap=0.5)})
    assert ablate.measure("sample", "no_length_penalty", 2, runs, extra, ledger)["bootstrap"] is None
    evals = ledger["runs"]["preset/seed2"]["evals"]
    evals["--beam_stop finished --alpha 0"]["against"] = ablate.decoding_key(settings)
    assert ablate.measure("sample", "no_length_penalty", 2, runs, extra, ledger)["bootstrap"] == 0.5
    assert calls == []


CPU = {"cpu": "a CPU", "class": "a CPU", "cores": 2, "bfloat16": True, "amx": False}  # a record's machine


def test_the_recipes_table_trains_three_seeds_a_side_and_judges_each_recipe_by_the_target(monkeypatch, tmp_path):
    """--table recipes: every recipe and the preset itself on seeds 1-3, no more asked for; a recipe
    meets the target only when fast enough and close enough, and a miss says which (made-up figures)."""
    figures = {"preset": (42.5, 30.0), "linear_8": (42.3, 10.5), "linear_7": (41.9, 10.0),
               "linear_10": (42.1, 13.0), "linear_11": (42.3, 14.5), "linear_12": (42.6, 16.0),
               "linear_8_light": (41.9, 11.0), "linear_8_hot": (41.9, 11.0), "linear_10_narrow": (42.0, 12.0),
               "linear_9_b2048": (41.8, 11.5), "linear_10_shallow": (42.0, 12.0), "linear_8_snapshots": (42.0, 11.0),
               "linear_10_shallow_snapshots": (42.0, 12.0)}  # beam, minutes
    noise = {"linear_11": (0.3, -0.6, 0.3)}  # beam BLEU added to a row's seeds 1-3
    trained = []

    def measure(preset, variant, seed, runs, extra, ledger, report_only=False, table="ablations"):
        assert table == "recipes" and runs == os.path.join("log", "recipes", "multi30k")
        trained.append((variant, seed))
        beam, minutes = figures[variant]
        return dict(beam=beam + 0.1 * (seed - 2) + noise.get(variant, (0, 0, 0))[seed - 1], greedy=40.0, loss=2.6,
                    minutes=minutes + seed, precision="bf16", commit="abc1234", date="2026-12-05",
                    machine=machines.get((variant, seed), "a CPU"),
                    machine_fields=None if (variant, seed) in machines else CPU)
    machines = {}  # (variant, seed): another machine, whose fields its run did not keep
    monkeypatch.setattr(ablate, "measure", measure)
    table = tmp_path / "recipes.md"
    record = tmp_path / "recipes-record.json"
    ablate.main(["--table", "recipes", "--output", str(table), "--record", str(record)])
    assert trained == [(name, seed) for name in RECIPES for seed in (1, 2, 3)]
    text = table.read_text(encoding="utf-8")
    rows = {line.split("|")[1].strip(): [cell.strip() for cell in line.split("|")] for line in text.splitlines()
            if line.startswith("| ") and not line.startswith("| row")}
    assert text.startswith("# Shorter recipes for the multi30k preset") and "at most 40% of the preset's" in text
    assert rows["linear_8"][9:12] == ["0.39", "-0.20", "meets the target"]  # 12.5 / 32 minutes
    assert rows["linear_7"][9:12] == ["0.38", "-0.60", "misses the target: 0.60 BLEU below the preset"]
    assert rows["linear_10"][9:12] == ["0.47", "-0.40", "misses the target: 0.47 of the preset's minutes and 0.40 "
                                          "BLEU below the preset"]
    assert rows["linear_12"][9:12] == ["0.56", "+0.10", "misses the target: 0.56 of the preset's minutes"]
    # 0.2 below by its mean, but its seeds' differences (+0.1, -0.8, +0.1) leave 0.5 at one standard error
    assert rows["linear_11"][9:12] == ["0.52", "-0.20", "misses the target: 0.52 of the preset's minutes and 0.20 "
                                          "BLEU below the preset, 0.50 at one standard error"]
    # the record holds the same rows, and bench/tables.py draws them as results.md's table
    from support import records
    kept = dict(records.read(record), file="recipes-record.json")
    assert kept["kind"] == "recipes" and kept["command"].startswith("ablate.py --table recipes")
    assert kept["machine"] == CPU  # where the runs trained, not where the table was written
    tables = bench_module("tables")
    drawn = {line.split(" | ")[0][2:]: line.split(" | ") for line in
             tables.recipes([kept], tables.WORDS["en"]).splitlines()[2:]}
    assert list(drawn) == list(RECIPES) and drawn["linear_8"][1] == f"`{' '.join(RECIPES['linear_8'][0])}`"
    assert drawn["linear_8"][5:11] == ["3", "12.5", "0.39", rows["linear_8"][6], "-0.20", "meets the target"]
    assert drawn["linear_12"][10] == rows["linear_12"][11]
    figures["linear_8"] = (42.5, 14.0)
    ablate.main(["--table", "recipes", "--output", str(table), "--only", "linear_8", "--seeds", "1,2"])
    assert "| 2 seeds a side: the target needs 3 |" in table.read_text(encoding="utf-8")
    ablate.main(["--table", "recipes", "--output", str(table), "--only", "linear_8"])
    assert "misses the target: 0.50 of the preset's minutes |" in table.read_text(encoding="utf-8")
    # a run on another machine: the table says so, and a record, which names one machine, is refused
    machines[("linear_8", 2)] = "another CPU"
    with pytest.raises(UserError, match="the runs trained on a CPU; another CPU: a record names one machine"):
        ablate.main(["--table", "recipes", "--output", str(table), "--only", "linear_8", "--record", str(record)])


def test_wall_seconds_adds_the_clocks_of_a_resumed_run():
    # train.py's elapsed_seconds restarts with each process: epochs 1-2, then a resume for 3-4
    history = [{"elapsed_seconds": t} for t in (60.0, 120.0, 70.0, 130.0)]
    assert wall_seconds(history) == 250.0


WITHIN = "within the seeds' variation"


def test_the_verdict_calls_noise_within_and_a_clear_effect_by_its_name():
    base = [41.4, 41.6, 41.5]
    assert verdict([41.2, 41.9, 41.3], base) == WITHIN  # a tenth of a point apart, seeds 0.7 apart
    assert verdict([40.1, 40.3, 40.2], base) == "worse"
    assert verdict([42.6, 42.5, 42.7], base) == "better"
    assert verdict([40.1, 40.3], base[:2]) == "worse on 2 seeds: needs more"
    assert verdict([40.0], base) == "one seed: no spread to judge by yet"
    # -0.52 against seeds 0.47 and 0.28 apart (two seeds each), which a max-min rule called worse
    assert verdict([40.785, 41.255], [41.41, 41.69]) == WITHIN


def test_a_row_trained_in_another_precision_is_not_compared():
    """A row whose runs were trained in float32 (a CPU without bfloat16) beside a preset trained in
    mixed bfloat16 gets no verdict: the two are different models, whatever their BLEU."""
    def seeds(precision, *beams):
        return [dict(beam=b, greedy=b - 1, loss=2.6, minutes=15.0, precision=precision) for b in beams]
    rows = summarize({"preset": seeds("mixed_bfloat16", 41.4, 41.6, 41.5),
                      "pre_norm": seeds("float32", 40.1, 40.3, 40.2),
                      "no_positions": seeds("mixed_bfloat16", 34.1, 34.3, 34.2)})
    assert rows["pre_norm"]["verdict"] == "not comparable: trained in float32, the preset in mixed_bfloat16"
    assert rows["no_positions"]["verdict"] == "worse"


def test_the_verdict_calls_about_one_difference_in_twenty_real_where_there_is_none():
    rng = np.random.default_rng(0)

    def calls(effect, trials=4000):  # the share of trials not called within, three seeds a side
        return np.mean([verdict(list(rng.normal(40 + effect, 0.3, 3)), list(rng.normal(40, 0.3, 3))) != WITHIN
                        for _ in range(trials)])
    assert 0.035 < calls(0.0) < 0.065  # the rule's stated 5%
    assert calls(1.2) > 0.9  # an effect of four standard deviations of a seed


def test_the_paired_bootstrap_finds_a_real_difference_and_not_an_equal_one():
    from support.scoring import paired_bootstrap
    rng = np.random.default_rng(0)
    references = [f"a dog number {i} runs on the grass today" for i in range(300)]

    def output(wrong):  # each sentence gets a wrong word with probability `wrong`
        return [r.replace("runs", "sits") if rng.random() < wrong else r for r in references]
    half = output(0.5)
    assert paired_bootstrap(half, half, references) == 1.0
    assert paired_bootstrap(half, output(0.5), references) > 0.05
    assert paired_bootstrap(half, output(0.2), references) < 0.01


def test_every_row_is_settings_that_train_and_eval_accept():
    """Each row's settings are the project's own options with valid values (a typo would otherwise
    surface only when the table's run reaches that row, hours in)."""
    for name, (train_args, eval_args, what) in [*VARIANTS.items(), *RECIPES.items()]:
        assert what and len(train_args) % 2 == 0 and len(eval_args) % 2 == 0, name
        _, _, overrides = hyperparams.parse_args("ablate", ["--preset", "multi30k", *train_args, *eval_args])
        assert set(overrides) == {option[2:] for option in (train_args + eval_args)[::2]}, name
    for preset, (settings, why) in [*TABLE_BASE.items(), *RECIPES_BASE.items()]:
        assert why and set(hyperparams.parse_args("ablate", ["--preset", preset, *settings])[2]) == \
            {option[2:] for option in settings[::2]}, preset


def test_the_shipped_recipes_ledger_is_what_each_row_trains_today():
    """The recipes table's runs were trained before the preset took linear_12: RECIPES_BASE pins the
    recipe they trained and the decoding they were scored with, so each run in docs/recipes.json is
    still its row's, its figures those of its row's decoding, and nothing is trained or decoded again;
    linear_12's runs are the current table's preset runs (docs/ablations-current.json: the same
    training; the preset's stopping rule has changed since, so a new table decodes them again); the
    old ablation table's base is the same recipe at 12 epochs, its last epoch's weights."""
    for path, table in (("recipes.json", "recipes"), ("ablations-current.json", "current")):
        ledger = json.loads(open(os.path.join(ROOT, "docs", path), encoding="utf-8").read())
        assert ledger
        for name, run in ledger.items():
            row, seed = name.split("/seed")
            _, got, command = ablate.run_command(run["preset"], row, int(seed), "runs", run["settings"], table)
            assert got == name
            wanted = ablate.run_settings(hyperparams.parse_args("", command)[0])
            assert ablate.differences(run["hparams"], wanted) == "", (path, name)
            if table == "recipes":
                key = ablate.decoding_key(wanted, RECIPES[row][1])
                assert key in ablate.keyed_by_decoding(run["evals"], run["hparams"]), (name, key)
    old, recipes = (hyperparams.parse_args("", ["--preset", "multi30k", *base["multi30k"][0]])[0]
                    for base in (TABLE_BASE, RECIPES_BASE))
    assert hyperparams.changed(old, recipes) == {"num_epochs": (12, 20), "average_last": (1, 5)}


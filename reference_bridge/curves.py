"""The training-curves experiment: the reference's unedited train.py and the port's
multi30k_reference preset side by side, their training loss and dev BLEU by epoch in one picture,
a table and a verdict (curves)."""
import dataclasses
import json
import os
import re
import subprocess
import sys

import data_load
import hyperparams
from reference_bridge.launch import COMMIT, IGNORED, train_reference, write_inputs
from reference_bridge.report import equality_report
from reference_bridge.weights import reference_args
from support.utils import UserError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository, whose train.py trains the port

CURVES_PRESET = "multi30k_reference"  # the reference's choices at Multi30k's size


def reference_history(run_dir, prepro_dir):
    """The epochs of a run of the reference's train.py in run_dir (its log/1 and eval/1), as the
    port's history.jsonl holds them: train_loss, the mean of the loss its summaries recorded at
    each step of the epoch (with dropout, as it trained); dev_bleu and dev_bleu_reference, its dev
    translation file scored by the project's scoring (sacreBLEU, and the reference's way);
    multi_bleu, the figure its own multi-bleu.perl appended to the file (None where it printed none)."""
    import glob
    import math

    import tensorflow as tf

    from support.scoring import bleu_scores
    with open(os.path.join(run_dir, "log", "1", "hparams"), encoding="utf-8") as f:
        settings = json.load(f)
    with open(settings["train1"], encoding="utf-8") as f:
        per_epoch = math.ceil(sum(1 for _ in f) / settings["batch_size"])  # its calc_num_batches
    losses = {}
    for events in sorted(glob.glob(os.path.join(run_dir, "log", "1", "events.out.tfevents.*"))):
        records = tf.compat.v1.train.summary_iterator(events)
        while True:
            try:
                event = next(records)
            except (StopIteration, tf.errors.DataLossError):  # the end, or a last record cut short
                break  # (a run stopped, or still writing)
            losses.update((event.step, v.simple_value) for v in event.summary.value if v.tag == "loss")
    references = data_load.load_text(prepro_dir, "dev", data_load.load_meta(prepro_dir)["tgt_lang"])
    history = []
    for epoch in range(1, settings["num_epochs"] + 1):
        written = glob.glob(os.path.join(run_dir, "eval", "1", f"iwslt2016_E{epoch:02d}L*"))
        if not written:
            break
        with open(written[0], encoding="utf-8") as f:
            lines = f.read().split("\n")
        hypotheses, report = lines[:len(references)], "\n".join(lines[len(references):])
        scores = bleu_scores(hypotheses, references)
        found = re.search(r"BLEU = ([\d.]+)", report)
        steps = [losses[step] for step in range((epoch - 1) * per_epoch + 1, epoch * per_epoch + 1) if step in losses]
        history.append(dict(epoch=epoch, train_loss=sum(steps) / len(steps) if steps else None,
                            dev_bleu=scores["sacrebleu"], dev_bleu_reference=scores["reference"],
                            multi_bleu=float(found.group(1)) if found else None))
    return history


def curves_table(reference_runs, port_runs):
    """Markdown: per epoch the mean over each side's runs of the training loss and dev BLEU both
    ways, then the last epoch's figures run by run, and the verdict: each metric's means, spreads
    (largest minus smallest run) and the difference, and what that many runs a side can show."""
    import statistics

    def mean(runs, epoch, key):
        values = [h[epoch - 1][key] for h in runs if len(h) >= epoch and h[epoch - 1].get(key) is not None]
        return f"{statistics.mean(values):.2f}" if values else ""

    epochs = max(len(h) for h in reference_runs + port_runs)
    lines = ["| epoch | train loss, reference | train loss, port | dev BLEU (sacreBLEU), reference | "
             "dev BLEU (sacreBLEU), port | dev BLEU (the reference's way), reference | "
             "dev BLEU (the reference's way), port |", "|---:|---:|---:|---:|---:|---:|---:|"]
    for epoch in range(1, epochs + 1):
        lines.append(f"| {epoch} | " + " | ".join(mean(runs, epoch, key) for key in ("train_loss", "dev_bleu",
                                                                                     "dev_bleu_reference")
                                                    for runs in (reference_runs, port_runs)) + " |")
    lines += ["", "The last epoch, run by run (its multi-bleu.perl's own figure beside the reference's):", "",
              "| run | epochs | dev BLEU (sacreBLEU) | dev BLEU (the reference's way) | multi-bleu.perl |",
              "|---|---:|---:|---:|---:|"]
    for side, runs in (("reference run", reference_runs), ("port seed", port_runs)):
        for number, history in enumerate(runs, 1):
            last = history[-1] if history else {}
            multi = last.get("multi_bleu")
            lines.append(f"| {side} {number} | {len(history)} | {last.get('dev_bleu', float('nan')):.2f} | "
                         f"{last.get('dev_bleu_reference', float('nan')):.2f} | "
                         f"{'' if multi is None else f'{multi:.2f}'} |")
    verdicts = []
    for key, metric in (("dev_bleu", "sacreBLEU"), ("dev_bleu_reference", "the reference's way")):
        finals = [[h[-1][key] for h in runs if h] for runs in (reference_runs, port_runs)]
        if not all(finals):
            continue
        ref, port = (statistics.mean(f) for f in finals)
        spreads = {side: max(f) - min(f) for side, f in zip(("the reference's runs", "the port's seeds"), finals)
                   if len(f) > 1}  # largest minus smallest run, where a side has more than one
        if len(spreads) == 2:
            measured = f" against runs that differ among themselves by up to {max(spreads.values()):.2f}"
        elif spreads:
            ((side, spread),) = spreads.items()
            measured = f"; {side} differ by {spread:.2f}, the other side's one run has no spread to measure"
        else:
            measured = ", with one run on a side: nothing to measure how far runs differ"
        verdicts.append(f"{metric}: the reference {ref:.2f} (runs {', '.join(f'{v:.2f}' for v in finals[0])}), the "
                        f"port {port:.2f} (seeds {', '.join(f'{v:.2f}' for v in finals[1])}), a difference of "
                        f"{port - ref:+.2f}{measured}")
    runs = min(len(reference_runs), len(port_runs))
    at = ("at the last epoch" if len({len(h) for h in reference_runs + port_runs}) == 1 else
          "at each run's last epoch so far (the runs have not all reached the same epoch)")
    lines += ["", f"Dev BLEU {at}, " + "; ".join(verdicts) + ". " +
              (f"With {runs} runs a side, a difference within the runs' own spread cannot be told from the "
               f"variation between runs, and a larger one is a sign, not a measured effect: it would take more runs "
               f"to put an interval on it." if runs > 1 else
               f"One run {'a side' if len(reference_runs) == len(port_runs) else 'on one side'}: nothing here can "
               f"be told from the variation between runs.")]
    return "\n".join(lines) + "\n"


def recorded(path):
    """The epochs of a run's history.jsonl, [] where there is none yet."""
    from support import pictures

    return pictures.read_history(path) if os.path.exists(path) else []


def curves(code, prepro_dir, workdir, runs, args, draw=False):
    """The reference's unedited train.py and the port's CURVES_PRESET, `runs` runs a side on
    prepro_dir's ids, args going to both (e.g. --warmup_steps 1000), after the equality report on
    those ids while a run is unfinished (<workdir>/check; UserError if a row fails):
    <workdir>/reference/run<N> and <workdir>/port/seed<N>, then <workdir>/curves.png (every run's
    training loss and dev BLEU by epoch, pictures.plot_runs) and <workdir>/curves.md (curves_table).
    Every run keeps its epochs in its own history.jsonl (the reference's written from its logs by
    reference_history), and a run whose history.jsonl holds every epoch is finished, its logs there
    or not: runs made on other machines join by that file. A stopped run resumes from its newest
    checkpoint. draw: train nothing (code, prepro_dir and args unused but to read a reference run's
    logs), and draw the runs as far as they have gone."""
    from support import pictures

    for name, why in IGNORED:  # both sides get args: one the reference ignores would train two programs
        if any(arg == f"--{name}" or arg.startswith(f"--{name}=") for arg in args):
            raise UserError(f"curves gives its arguments after -- to both sides, and the reference ignores "
                            f"--{name} ({why}): drop it, or the two sides train different losses")
    hp = dataclasses.replace(hyperparams.preset(CURVES_PRESET), prepro_dir=prepro_dir)
    files = None if draw else write_inputs(prepro_dir, os.path.join(workdir, "data"))
    wanted = epochs_in(args, hp.num_epochs)  # a run with this many epochs is finished
    folders = [(os.path.join(workdir, "reference", f"run{number}"), os.path.join(workdir, "port", f"seed{number}"))
               for number in range(1, runs + 1)]
    kept = {folder: recorded(os.path.join(folder, "history.jsonl")) for pair in folders for folder in pair}
    if not draw and any(len(history) < wanted for history in kept.values()):
        # minutes that prove, on these ids, what the hours of training will compare
        if equality_report(code, prepro_dir, os.path.join(workdir, "check")):
            raise UserError(f"the reference's code and the port do not compute the same numbers on {prepro_dir} "
                            f"(the report above, its files in {os.path.join(workdir, 'check')}): the curves would "
                            f"compare two different programs; see PORTING.md")
    reference_runs, port_runs = [], []
    for number, (run_dir, logdir) in enumerate(folders, 1):
        saved = os.path.join(run_dir, "history.jsonl")
        history = kept[run_dir]
        if len(history) < wanted and os.path.exists(os.path.join(run_dir, "log", "1", "hparams")):
            if prepro_dir is None:
                raise UserError(f"{run_dir} has the reference's logs but no finished history.jsonl: give "
                                f"--prepro_dir (the ids it trained on) to score its translation files")
            history = reference_history(run_dir, prepro_dir)
        if len(history) < wanted and not draw:
            train_reference(code, files, run_dir, [*reference_args(hp), *args])
            history = reference_history(run_dir, prepro_dir)
        if history and history != kept[run_dir]:
            with open(saved, "w", encoding="utf-8") as f:
                f.writelines(json.dumps(epoch) + "\n" for epoch in history)
        reference_runs.append(history)
        saved = os.path.join(logdir, "history.jsonl")
        history = kept[logdir]
        if len(history) < wanted and not draw:
            command = [sys.executable, os.path.join(ROOT, "train.py"),
                       "--preset", CURVES_PRESET, "--prepro_dir", prepro_dir, "--logdir", logdir, "--seed", str(number),
                       *args]
            print(" ".join(command), flush=True)
            if subprocess.run(command).returncode != 0:
                raise UserError(f"train.py stopped for {logdir} (its output above)")
            history = recorded(saved)
        port_runs.append(history)
    reference_runs, port_runs = [h for h in reference_runs if h], [h for h in port_runs if h]
    if not reference_runs or not port_runs:
        raise UserError(f"{workdir}: no epoch of {'the reference' if not reference_runs else 'the port'} to draw "
                        f"yet (reference/run<N>/ and port/seed<N>/ hold the runs)")
    compared = ("epoch", "train_loss", "dev_bleu", "dev_bleu_reference")  # what both sides measure
    named = [(f"{side} {n}", [{key: e.get(key) for key in compared} for e in history])
             for side, runs in (("reference run", reference_runs), ("port seed", port_runs))
             for n, history in enumerate(runs, 1)]
    pictures.plot_runs(named, os.path.join(workdir, "curves.png"))
    table = curves_table(reference_runs, port_runs)
    settings = "" if draw else (f"Both trained on {prepro_dir}; settings given to both: "
                                f"{' '.join(args) or 'none'}.\n\n")
    with open(os.path.join(workdir, "curves.md"), "w", encoding="utf-8") as f:
        f.write(f"# The reference's code (commit {COMMIT[:7]}, 2019-09-24) beside the port's {CURVES_PRESET}\n\n"
                + settings + table)
    print(table, end="")
    print(f"wrote {os.path.join(workdir, 'curves.png')} and {os.path.join(workdir, 'curves.md')}")



def epochs_in(args, default):
    """The --num_epochs among args (the last one given wins, as in argparse), else default."""
    value = default
    for i, arg in enumerate(args):
        if arg == "--num_epochs" and i + 1 < len(args):
            value = int(args[i + 1])
        elif arg.startswith("--num_epochs="):
            value = int(arg.split("=", 1)[1])
    return value

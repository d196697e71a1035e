"""Ablations: what each choice of the paper and of the reference is worth, measured on dev.

Trains variants of a preset (each a few settings changed from it, or from the recipe its table
measures where the preset has moved on: VARIANTS and TABLE_BASE below), two seeds
each and a third where the rule asks for one (--more_seeds), and writes a table: dev BLEU with
greedy decoding and with the preset's beam search, dev loss per target token, the seeds' standard
deviation, minutes, and each variant's difference to the preset with a verdict in plain words by a
stated rule (RULE: Student's t test on the seeds, 5%, three seeds a side for "better" or "worse");
and a bar chart of the differences. With --table recipes it trains RECIPES instead: shorter ways
to train the preset, three seeds each beside the preset's recipe before them (RECIPES_BASE), each
judged by TARGET (its share of that recipe's training minutes, its dev BLEU against that recipe's);
with --table current, VARIANTS against the preset as it is today, with no older recipe before them.

    python ablate.py --preset multi30k --output docs/ablations.md   # every variant: hours on a 2-core CPU
    python ablate.py --preset multi30k --only no_positions     # one variant and the preset itself
    python ablate.py --preset sample --num_epochs 1            # minutes: a dry run
    python ablate.py --table recipes --output docs/recipes.md  # hours: alone on the machine, for the minutes
    python ablate.py --table current --only pre_norm           # a row against the preset as it is today

Runs go to <runs>/<variant>/seed<seed> (--runs; default log/<table>/<preset>), the table to
<runs>/<table>.md unless --output names another file (the shipped docs/ablations.md is rewritten
only when named). A run that finished is not trained again, an interrupted one resumes where it
stopped (train.py resumes from its checkpoints), and each run's scores are kept in its folder
(ablation.json), so the command can be stopped and started again at any point. They are kept in a
ledger beside the table too (<table>.json unless --ledger names another file, e.g.
docs/ablations.json, with the machine, date, commit and settings of each run): a run recorded there
is not trained again, so one table can be finished over several sessions or machines, unless what
it trained is no longer its row's (the preset's training changed, say): then it trains again, and a
finished run folder of other settings is refused rather than counted. Settings that only decode
(DECODING_ONLY: the beam, its length penalty and stopping rule, the weights averaged) are not
training: a run's figures are kept under the decoding they were made with, and a run decoded
otherwise than its row now decodes (a row that decodes the preset's runs another way, or the
preset's new beam search) is decoded again from its checkpoints, or trained again where they are not
on this machine. Settings after the options (`--name value`) apply to every run (the dry run
above trains one epoch). Everything is measured on dev: the table is for choosing, and test figures
are not computed here. The table's document is rewritten down to its first `## ` heading; sections
from there on are the document's own (written by hand) and are kept.
"""
import argparse
import dataclasses
import datetime
import json
import math
import os
import re
import statistics
import subprocess
import sys

import data_load
import hyperparams
from support import records
from support.pictures import plot_ablations, read_history, wall_seconds
from support.scoring import paired_bootstrap, read_hypotheses
from support.utils import UserError, atomic_write, machine, run_cli

HERE = os.path.dirname(os.path.abspath(__file__))

# name: (settings changed for training, settings changed for evaluation, what it measures). A
# variant with no training settings evaluates the preset's own runs another way.
VARIANTS = {
    "preset": ([], [], "the preset as it is: the baseline every row is compared with"),
    "pre_norm": (["--norm", "pre"], [], "layer norm before each sublayer (later work) instead of after it (3.1)"),
    "learned_positions": (["--positional", "learned"], [], "a learned position table instead of sinusoids (3.5; "
                                                         "the reference's 2017 code learned one too, initialised "
                                                         "Glorot-uniform, here N(0, 0.02))"),
    "no_positions": (["--positional", "none"], [], "no positional encoding at all (3.5)"),
    "unscaled_embeddings": (["--scale_embeddings", "0"], [], "embeddings without the sqrt(d_model) factor (3.4): "
                                                            "initialised N(0, 1/d_model), they then start about 11 "
                                                            "times smaller than the positional encoding"),
    "separate_embeddings": (["--share_embeddings", "0"], [], "three matrices (source, target, output) instead of "
                                                            "one shared (3.4)"),
    "no_residual_dropout": (["--residual_dropout", "0"], [], "no dropout on the sublayers' outputs, as the "
                                                            "reference (5.4)"),
    "attention_dropout": (["--attention_dropout", "-1"], [], "the attention weights dropped at --dropout_rate, as "
                                                             "the reference (the paper's 5.4 drops the sublayers' "
                                                             "outputs and the embedding sums)"),
    "no_output_projection": (["--attention_output", "0"], [], "no W^O after the heads, as the reference (3.2.2)"),
    "no_smoothing": (["--smoothing", "0"], [], "no label smoothing (5.4: 0.1)"),
    "smoothing_0.2": (["--smoothing", "0.2"], [], "twice the label smoothing"),
    "short_warmup": (["--warmup_steps", "300"], [], "a quarter of the multi30k preset's warmup (5.3)"),
    "reference_adam": (["--adam_beta2", "0.999", "--adam_epsilon", "1e-8"], [],
                       "Adam's TensorFlow defaults, as the reference (5.3: 0.98, 1e-9)"),
    "xavier_embeddings": (["--embedding_init", "xavier"], [], "Glorot-uniform embeddings, as the reference"),
    "zero_pad_logit": (["--pad_logit", "zero"], [], "the <pad> logit held at 0, as the reference"),
    "sentence_batches": (["--batch_sentences", "128"], [], "batches of 128 random sentences, as the reference, "
                                                          "instead of token budgets"),
    "whole_vocabulary": (["--output_vocab", "all"], [], "the softmax over the whole vocabulary, as the reference"),
    "two_heads": (["--num_heads", "2"], [], "half the attention heads (3.2.2)"),
    # candidates that might lift the preset (later work, or the paper's recipe at more length)
    "subword_sampling": (["--subword_sampling", "0.1"], [], "candidate: BPE-dropout 0.1, the training text "
                                                           "re-segmented every epoch (later work)"),
    "wider_feed_forward": (["--d_ff", "2048"], [], "candidate: a feed-forward twice as wide, 8 d_model "
                                                  "(3.3: 4 d_model)"),
    "longer_averaged": (["--num_epochs", "20"], ["--average_last", "5"], "candidate: 20 epochs instead of 12, "
                                                                         "the last five averaged (6.1)"),
    "average_last_5": ([], ["--average_last", "5"], "the mean of the last five epochs' weights (6.1)"),
    "no_length_penalty": ([], ["--alpha", "0"], "beam search without its length penalty"),
    "paper_length_penalty": ([], ["--alpha", "0.6"], "the paper's length penalty (6.1: alpha 0.6) instead of the "
                                                     "preset's 1.4, chosen on dev"),
    "beam_8": ([], ["--beam_size", "8"], "twice the beam"),
    "beam_stop_finished": ([], ["--beam_stop", "finished"], "beam search ends a sentence once beam_size hypotheses "
                                                            "have ended (CTranslate2's and fairseq's rule: fewer "
                                                            "steps) instead of once no open one can beat the best"),
}
BASELINE = "preset"
# preset: (settings every run of its table trains with before its row's own, why): the recipe the
# table measures, where the preset has moved on since the table was begun.
# The recipe includes the decoding of its day: the exact stopping rule (the preset has since taken
# --beam_stop finished), so that the tables' figures stay those of the runs they were decoded from.
OLD_MULTI30K = ["--lr_decay", "rsqrt", "--lr", "1e-3", "--warmup_steps", "1200", "--dropout_rate", "0.15",
                "--beam_stop", "bound"]
TABLE_BASE = {"multi30k": ([*OLD_MULTI30K, "--num_epochs", "12", "--average_last", "1"],
                           "the preset's recipe and stopping rule when the table was measured; it has since taken "
                           "the row longer_averaged, then the recipe linear_12 of docs/recipes.md and the rule "
                           "finished")}


def linear(epochs, *extra, lr="2e-3", warmup="600", dropout="0.1", average="1"):
    """A recipe's settings: the rate rising for `warmup` steps to `lr` and falling linearly to 0 by the
    last of `epochs` epochs, then `extra`, the mean of the last `average` weights (1: the last epoch's)."""
    return ["--num_epochs", str(epochs), "--lr_decay", "linear", "--lr", lr, "--warmup_steps", warmup,
            "--dropout_rate", dropout, *extra, "--average_last", average]


# The recipes table (--table recipes): shorter ways to train the preset, each against the preset's
# recipe before the search (RECIPES_BASE), on three seeds a side, judged by TARGET. Settings as
# VARIANTS'; a recipe's --average_last (and --average_every) is kept in its run's settings, so eval.py
# scores the weights the recipe averages.
RECIPES = {
    "preset": ([], [], "the preset's recipe before the search: the baseline every recipe is compared with"),
    "linear_8": (linear(8), [], "8 epochs, the learning rate twice the preset row's and falling linearly to 0 at "
                                "the end, a quarter-epoch warmup, dropout 0.1, the last epoch's weights"),
    "linear_7": (linear(7), [], "linear_8 in 7 epochs"),
    "linear_10": (linear(10), [], "linear_8 in 10 epochs"),
    "linear_11": (linear(11), [], "linear_8 in 11 epochs"),
    "linear_12": (linear(12), [], "linear_8 in 12 epochs"),
    "linear_8_light": (linear(8, "--weight_decay", "0.1", dropout="0.05"), [],
                       "linear_8 with half its dropout and a third of its weight decay: less regularizing for "
                       "a short run"),
    "linear_8_hot": (linear(8, lr="3e-3"), [], "linear_8 at a peak rate of 3e-3"),
    "linear_10_narrow": (linear(10, "--d_ff", "512"), [],
                         "linear_10 with half the feed-forward width (d_ff 512): cheaper steps, more of them"),
    "linear_9_b2048": (linear(9, "--tokens_per_batch", "2048", lr="3e-3", warmup="300"), [],
                       "batches of twice the tokens at a rate of 3e-3 with half the warmup steps, 9 epochs: "
                       "fewer, faster steps"),
    "linear_8_snapshots": (linear(8, "--average_every", "50", average="20"), ["--average_last", "5"],
                           "linear_8, scored on the mean of the last five of snapshots of its weights taken "
                           "every 50 steps (it keeps 20; the five chosen on seed 1's dev)"),
    "linear_10_shallow": (linear(10, "--num_blocks", "2"), [],
                          "linear_10 with two encoder and two decoder blocks instead of three: cheaper steps, "
                          "more of them"),
    "linear_10_shallow_snapshots": (linear(10, "--num_blocks", "2", "--average_every", "50", average="5"), [],
                                    "the two levers nearest the target together: linear_10_shallow scored on the "
                                    "mean of its last five snapshots taken every 50 steps"),
}
RECIPES_BASE = {"multi30k": ([*OLD_MULTI30K, "--num_epochs", "20", "--average_last", "5"],
                             "the preset's recipe and stopping rule before the search; it has since taken the "
                             "recipe linear_12 and the rule finished")}
TARGET_RATIO, TARGET_BLEU = 0.40, 0.3
TARGET = (f"a recipe meets the target when it trains in at most {TARGET_RATIO:.0%} of the preset's minutes and "
          f"its mean dev beam BLEU, less one standard error of its seed-by-seed differences to the preset's, is at "
          f"most {TARGET_BLEU} below the preset's (so that its seeds' noise cannot carry it inside), with at least "
          f"{{seeds}} seeds a side; minutes are the mean wall time of a seed's training, comparable only where "
          f"every run trained on the same machine with nothing else running")
# --table: the rows, the recipe each run trains before its row's own settings (per preset), and
# the seeds each row trains by default (the runs go to log/<table>/<preset>).
# "current": the ablation rows against the preset as it is, no older recipe first (docs/ablations-current.md).
TABLES = {"ablations": (VARIANTS, TABLE_BASE, "1,2"), "recipes": (RECIPES, RECIPES_BASE, "1,2,3"),
          "current": (VARIANTS, {}, "1,2")}


def run_script(script, args):
    """Run one of the project's scripts with this interpreter, its output shown as it comes and
    kept; a UserError (the script's last line) if it fails."""
    process = subprocess.Popen([sys.executable, os.path.join(HERE, script), *args], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in process.stdout:
        lines.append(line)
        print("    " + line, end="", flush=True)
    if process.wait() != 0:
        last = next((line.strip() for line in reversed(lines) if line.strip()), "")
        raise UserError(f"{script} {' '.join(args)} failed (exit {process.returncode}): {last}")
    return "".join(lines)


def trained(logdir):
    """The run's history if it trained every epoch it was asked for, else None."""
    try:
        with open(os.path.join(logdir, "hparams.json"), encoding="utf-8") as f:
            wanted = json.load(f)["num_epochs"]
        history = read_history(os.path.join(logdir, "history.jsonl"))
    except (OSError, UserError):
        return None
    return history if len(history) >= wanted else None


def seed_list(option, text):
    try:
        return [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise UserError(f"{option} {text}: give comma-separated integers, e.g. 1,2") from None


def measure(preset, variant, seed, runs, extra, ledger, report_only=False, table="ablations"):
    """Train (or resume) one run of a table's row and score it on dev, decoded as the row decodes
    (decoding_key); its figures, kept in <run>/ablation.json and in the ledger (a run recorded there,
    trained in another session or on another machine, is not trained again; where it was decoded
    otherwise, it is decoded again from its checkpoints here, or trained again where they are not).
    With report_only, a run that has not finished training is left alone (None)."""
    train_args, eval_args, _ = TABLES[table][0][variant]
    logdir, name, command = run_command(preset, variant, seed, runs, extra, table)
    wanted = run_settings(hyperparams.parse_args("", command)[0])
    key, preset_key = decoding_key(wanted, eval_args), decoding_key(wanted)  # the row's decoding, the preset's
    scores_path = os.path.join(logdir, "ablation.json")
    scores = {}
    if os.path.exists(scores_path):
        with open(scores_path, encoding="utf-8") as f:
            scores = json.load(f)
    history = trained(logdir)
    if history is not None:
        had = run_settings(hyperparams.load_hparams(logdir))
        if changed := differences(had, wanted):
            raise UserError(f"{logdir} trained other settings than {name} trains now ({changed}): move that folder "
                            f"away (or give another --runs) to train it again")
        scores["evals"] = keyed_by_decoding(scores.get("evals", {}), had)
    recorded = ledger["runs"].get(name)
    if history is None and recorded and recorded.get("preset") == preset:
        if "hparams" in recorded:
            changed = differences(recorded["hparams"], wanted)
        else:  # an entry from before the ledger kept a run's settings: only those given to every run compared
            changed = "" if recorded.get("settings") == extra else "the settings given to every run"
        evals = keyed_by_decoding(recorded["evals"], recorded.get("hparams", wanted))
        if not changed and key in evals:  # its figures as recorded; its checkpoints are elsewhere
            return figures(dict(recorded, evals=evals), key, preset_key, train_args or variant == BASELINE)
        if not report_only:
            why = (f"trained other settings ({changed})" if changed else
                   f"was decoded otherwise ({', '.join(evals)}), and its checkpoints are not in {logdir}")
            print(f"{name}: the ledger's run {why}: training it again", flush=True)
    if history is None:
        if report_only:
            return None
        started = dict(commit=records.commit(), date=datetime.date.today().isoformat(), machine=machine(),  # the code
                       machine_fields=records.machine_fields())
        out = run_script("train.py", command)
        history = trained(logdir)
        scores = dict(started, precision=re.search(r"precision (\S+),", out).group(1))  # train.py's devices line
    if scores.get("epochs") not in (None, len(history)):  # scores of an earlier state of the run
        scores = {k: scores[k] for k in ("precision", "commit", "date", "machine", "machine_fields") if k in scores}
    evals = scores.setdefault("evals", {})  # {eval.py's settings: what it measured with them}
    if key not in evals:
        out = run_script("eval.py", ["--logdir", logdir, "--split", "dev", *key.split()])
        evals[key] = dict(beam=found(out, r"BLEU dev sacreBLEU = ([\d.]+)", logdir),
                          loss=found(out, r"loss dev ([\d.]+)", logdir),
                          hypotheses=re.search(r"in the reference's layout, (.+)$", out, re.M).group(1).strip())
        if "--average_last" in eval_args:  # weights other than the last epoch's: their own greedy BLEU
            out = run_script("eval.py", ["--logdir", logdir, "--split", "dev", *key.split(), "--beam_size", "1"])
            evals[key]["greedy"] = found(out, r"BLEU dev sacreBLEU = ([\d.]+)", logdir)
    measured, preset_measured = evals[key], evals.get(preset_key, {})
    if (not train_args and key != preset_key and measured.get("against") != preset_key  # against an older preset
            and "hypotheses" in measured and "hypotheses" in preset_measured):
        measured.update(bootstrap=bootstrap(logdir, preset_measured["hypotheses"], measured["hypotheses"]),
                        against=preset_key)
    last = history[-1]
    scores.update(greedy=last["dev_bleu"], epochs=len(history), minutes=wall_seconds(history) / 60)
    write_text(scores_path, json.dumps(scores, indent=1) + "\n")
    ledger["runs"][name] = dict(scores, preset=preset, settings=extra, hparams=wanted,  # not its translations
                                evals={k: {f: v for f, v in e.items() if f != "hypotheses"} for k, e in evals.items()})
    write_text(ledger["path"], json.dumps(ledger["runs"], indent=1, sort_keys=True) + "\n")
    return figures(scores, key, preset_key, train_args or variant == BASELINE)


def run_command(preset, variant, seed, runs, extra, table):
    """Where one run of a table's row trains, its name in the ledger ("<folder>/seed<seed>") and
    train.py's options for it: the table's base, then the row's settings, then extra."""
    variants, table_base, _ = TABLES[table]
    train_args = variants[variant][0]
    folder = BASELINE if not train_args else variant
    logdir = os.path.join(runs, folder, f"seed{seed}")
    return logdir, f"{folder}/seed{seed}", ["--preset", preset, "--logdir", logdir, "--seed", str(seed),
                                            *table_base.get(preset, ([],))[0], *train_args, *extra]


def run_settings(hp):
    """A run's settings as a dict, for comparing two runs: all but where the run is and the
    languages (train.py takes those from the prepro folder)."""
    settings = {k: v for k, v in dataclasses.asdict(hp).items() if k not in ("logdir", "src_lang", "tgt_lang")}
    return json.loads(json.dumps(settings))  # as the ledger keeps them


# Settings that change only how a trained run is decoded, not what it trains (average_last trains too
# where --average_every is set: train.py keeps that many snapshots): a row that changes only these
# decodes the preset's runs again, and a run's figures are kept under the decoding they were made with.
DECODING_ONLY = ("beam_size", "alpha", "beam_stop", "average_last")


def training(settings):
    """Of run_settings, those that change what train.py trains: all but DECODING_ONLY's."""
    return {k: v for k, v in settings.items()
            if k not in DECODING_ONLY or (k == "average_last" and settings.get("average_every"))}


def differences(had, wanted):
    """The settings two run_settings trained differently with, in words ("" when none):
    "--lr_decay rsqrt (now linear), ...". had may be older than a field: it counts as it was then."""
    had = run_settings(hyperparams.Hparams(**hyperparams.as_saved(had)))
    return ", ".join(f"--{k} {was} (now {now})"
                     for k, (was, now) in hyperparams.changed(training(had), training(wanted)).items())


def decoding_key(settings, eval_args=()):
    """eval.py's options that decode a run of `settings` (run_settings) with a row's eval_args on
    top, in DECODING_ONLY's order: the key a run's figures are kept under, e.g.
    "--beam_size 4 --alpha 1.4 --beam_stop finished --average_last 1"."""
    hp = hyperparams.Hparams(**hyperparams.as_saved(settings))
    given = dict(zip(eval_args[::2], eval_args[1::2]))
    values = {f: type(getattr(hp, f))(given.get(f"--{f}", getattr(hp, f))) for f in DECODING_ONLY}
    return " ".join(f"--{f} {v:g}" if isinstance(v, float) else f"--{f} {v}" for f, v in values.items())


def keyed_by_decoding(evals, settings):
    """A run's evals ({key: figures}) keyed by decoding_key, for a run trained with `settings`: keys
    written before, "as trained" (the run's own decoding) or only the options a row changed
    ("--alpha 0"), name the same decoding in full; a paired bootstrap says which decoding it was
    against ("against": then the run's own)."""
    own = decoding_key(settings)
    return {decoding_key(settings, [] if k == "as trained" else k.split()): {"against": own, **v} if "bootstrap" in v
            else v for k, v in evals.items()}


def figures(scores, key, preset_key, trains):
    """One run's figures for the table, as measured with eval.py's settings `key`; minutes only for a
    row that trains, the paired bootstrap only where it was against the preset's decoding (preset_key)."""
    measured = scores["evals"][key]
    return dict(scores, greedy=measured.get("greedy", scores["greedy"]), beam=measured["beam"],
                loss=measured["loss"], minutes=scores["minutes"] if trains else None,
                bootstrap=measured.get("bootstrap") if measured.get("against") == preset_key else None)


def read_ledger(path):
    """The ledger of every run's figures beside a table (<table>.json): {"path", "runs": {run: scores}}."""
    try:
        with open(path, encoding="utf-8") as f:
            return dict(path=path, runs=json.load(f))
    except FileNotFoundError:
        return dict(path=path, runs={})
    except ValueError as error:
        raise UserError(f"{path}: not the ledger ablate.py writes ({error}); move it away to start a new one") \
            from None


def bootstrap(logdir, preset_hypotheses, row_hypotheses):
    """sacreBLEU's paired bootstrap of a row's dev translations against the preset's, from the same
    run (the same model decoded another way, so the same sentences pair up): its p-value, a second
    opinion beside RULE."""
    with open(os.path.join(logdir, "hparams.json"), encoding="utf-8") as f:
        settings = json.load(f)
    references = data_load.load_text(settings["prepro_dir"], "dev", settings["tgt_lang"])
    return paired_bootstrap(read_hypotheses(preset_hypotheses), read_hypotheses(row_hypotheses), references,
                            settings["tgt_lang"])


def found(output, pattern, logdir):
    """The number eval.py printed where pattern's group is; a UserError if it printed none."""
    match = re.search(pattern, output)
    if not match:
        raise UserError(f"eval.py --logdir {logdir}: no {pattern!r} in its output")
    return float(match.group(1))


def write_text(path, text):
    with atomic_write(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        f.write(text)


# Student's t, two-sided, 5%: the critical value for 1 to 20 degrees of freedom (any statistics
# table); beyond 20, the value at 20 (a little stricter than the exact one).
T_CRITICAL = (None, 12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
              2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086)
MIN_SEEDS = 3  # the fewest seeds on each side for a verdict other than "within"
NEEDS_MORE = ": needs more"  # the end of the verdict on a difference that passes with fewer seeds
RULE = (f"a row is better or worse than the preset when Student's t test on the two rows' seeds (pooled "
        f"variance, two-sided) puts the difference of their beam BLEU beyond what the seeds' own variation "
        f"gives by chance 5% of the time, with at least {MIN_SEEDS} seeds on each side; a difference that "
        f"passes with fewer seeds is marked as needing more, and any other is within the seeds' variation; "
        f"a row trained in another precision than the preset (float32 beside mixed bfloat16) is not compared")


def margin(a, b):
    """Half the width of the 95% interval of mean(a) - mean(b): the smallest difference the rule
    calls real (inf with fewer than two seeds on a side)."""
    if min(len(a), len(b)) < 2:
        return math.inf
    df = len(a) + len(b) - 2
    pooled = ((len(a) - 1) * statistics.variance(a) + (len(b) - 1) * statistics.variance(b)) / df
    return T_CRITICAL[min(df, len(T_CRITICAL) - 1)] * math.sqrt(pooled * (1 / len(a) + 1 / len(b)))


def verdict(row, base):
    """Plain words for a row's beam BLEU over its seeds (row) against the baseline's (base), by RULE."""
    if min(len(row), len(base)) < 2:
        return "one seed: no spread to judge by yet"
    difference = statistics.mean(row) - statistics.mean(base)
    if abs(difference) <= margin(row, base):
        return "within the seeds' variation"
    word = "better" if difference > 0 else "worse"
    return word if min(len(row), len(base)) >= MIN_SEEDS else f"{word} on {min(len(row), len(base))} seeds{NEEDS_MORE}"


def recipe_verdict(row, base):
    """Plain words for a recipe's row against the preset's (summarize's rows), by TARGET."""
    seeds = min(row["seeds"], base["seeds"], len(row["paired"]))
    if seeds < MIN_SEEDS:
        return f"{seeds} seed{'s' if seeds > 1 else ''} a side: the target needs {MIN_SEEDS}"
    low = row["low"]
    fast, close = row["ratio"] <= TARGET_RATIO, min(row["difference"], low) >= -TARGET_BLEU
    if fast and close:
        return "meets the target"
    below = f"{-row['difference']:.2f} BLEU below the preset"
    if row["difference"] >= -TARGET_BLEU:  # inside by its mean, not by its noise
        below += f", {-low:.2f} at one standard error"
    return "misses the target: " + " and ".join(
        why for why, miss in ((f"{row['ratio']:.2f} of the preset's minutes", not fast), (below, not close)) if miss)


def summarize(results, table="ablations"):
    """{variant: row} from {variant: [figures of each seed]}: means, standard deviations, difference
    to the baseline's beam BLEU, its margin and verdict (RULE; for the recipes table, TARGET), the
    ratio of its minutes to the baseline's, and where and when the runs were trained."""
    rows = {}
    for name, seeds in results.items():
        beam = [s["beam"] for s in seeds]
        rows[name] = dict(greedy=statistics.mean(s["greedy"] for s in seeds), beam=statistics.mean(beam),
                          beams=beam, loss=statistics.mean(s["loss"] for s in seeds),
                          sd=statistics.stdev(beam) if len(beam) > 1 else 0.0,
                          minutes=statistics.mean(m) if (m := [s["minutes"] for s in seeds if s["minutes"]]) else None,
                          seeds=len(seeds), bootstrap=[s["bootstrap"] for s in seeds if s.get("bootstrap") is not None],
                          **{key: sorted({s.get(key, "unrecorded") for s in seeds})
                             for key in ("precision", "commit", "date", "machine")},
                          machines=[(s.get("machine"), s.get("machine_fields")) for s in seeds])  # seed by seed
    base = rows[BASELINE]
    base_by_seed = {s.get("seed", i): s["beam"] for i, s in enumerate(results[BASELINE])}
    for name, row in rows.items():
        row["difference"] = row["beam"] - base["beam"]
        # beam BLEU minus the preset's, seed by seed (the seeds both have; by position where unrecorded)
        row["paired"] = [s["beam"] - base_by_seed[seed] for i, s in enumerate(results[name])
                         if (seed := s.get("seed", i)) in base_by_seed]
        # the mean difference less one standard error of the differences seed by seed
        row["low"] = (statistics.mean(row["paired"]) - statistics.stdev(row["paired"]) / math.sqrt(len(row["paired"]))
                      if len(row["paired"]) > 1 else None)
        row["margin"] = 0.0 if name == BASELINE else margin(row["beams"], base["beams"])
        row["ratio"] = row["minutes"] / base["minutes"] if row["minutes"] and base["minutes"] else None
        row["verdict"] = ("the baseline" if name == BASELINE else recipe_verdict(row, base) if table == "recipes"
                          else verdict(row["beams"], base["beams"]))
        if name != BASELINE and row["precision"] != base["precision"]:  # e.g. float32 on a CPU without bfloat16
            row["verdict"] = (f"not comparable: trained in {', '.join(row['precision'])}, the preset in "
                              f"{', '.join(base['precision'])}")
    return rows


def write_table(path, picture, ledger, rows, preset, seeds, more_seeds, argv, unfinished=(0, 0), table="ablations"):
    """The table's document (docs/ablations.md, or the recipes'), where its picture and ledger are, and
    how the figures were made; unfinished: (runs left out as not finished (--report), runs asked for)."""
    variants, table_base, _ = TABLES[table]
    hp = hyperparams.parse_args("", ["--preset", preset, *table_base.get(preset, ([],))[0]])[0]  # as the table decodes
    beam = (f"beam {hp.beam_size}, alpha {hp.alpha:g}, ended " + ("once no open hypothesis can beat the best" if
                                                                 hp.beam_stop == "bound" else
                                                                 f"once {hp.beam_size} hypotheses have finished"))

    def each(key):  # one of the runs' provenance fields over every row
        return ", ".join(sorted({value for row in rows.values() for value in row[key]}))

    scores = (f"scores it on dev: sacreBLEU greedy (the BLEU after the last epoch) and with the preset's beam search "
              f"({beam}, on the weights the run's --average_last says), and the "
              f"dev loss per target token, each the mean over the row's seeds (beam BLEU with its standard deviation)")
    base = (f" as the table measures it (`{' '.join(table_base[preset][0])}`: {table_base[preset][1]})"
            if preset in table_base else "")
    if table == "recipes":
        intro = (f"Each row trains the {preset} preset{base} with a shorter recipe, once per seed "
                 f"({', '.join(map(str, seeds))}), and {scores}. The difference is the row's beam BLEU minus "
                 f"the preset's; the time ratio is the row's minutes over the preset's. The target: "
                 f"{TARGET.format(seeds=MIN_SEEDS)}. Minutes are the wall time of training one seed, evaluation "
                 f"after each epoch included.")
        columns = "time ÷ preset's | difference | verdict"
    else:
        intro = (f"Each row trains the {preset} preset{base} with a few settings changed, once per seed "
                 f"({', '.join(map(str, seeds))}"
                 + (f"; {', '.join(map(str, more_seeds))} too where the rule asks for more" if more_seeds else "")
                 + f"), and scores the last epoch on dev: sacreBLEU greedy (the BLEU after each epoch) and with the "
                 f"preset's beam search ({beam}), and the dev loss per target token, each the mean over the row's seeds"
                 f" (beam BLEU with its standard deviation). A row with no training settings scores the preset's own "
                 f"runs another way. The difference is the row's beam BLEU minus the preset's, with the margin the rule"
                 f" needs. The rule: {RULE}. For a row that decodes the preset's own runs another way, sacreBLEU's "
                 f"paired bootstrap of its dev translations against the preset's (p, seed by seed: small means a "
                 f"difference chance rarely gives) is a second opinion. Minutes are the wall time of training one seed,"
                 f" evaluation after each epoch included: they rise with whatever else the machine runs meanwhile, so "
                 f"they are a guide to cost, not a speed measurement (docs/speed.md measures speed, side by side).")
        columns = "difference (± margin) | verdict | paired bootstrap p"
    title = (f"Shorter recipes for the {preset} preset" if table == "recipes" else f"Ablations of the {preset} preset"
             + (" as it is now" if table == "current" else ""))
    lines = [f"# {title}", "", intro, "",
             f"Made with `python ablate.py {' '.join(argv)}` (table written on "
             f"{datetime.date.today().isoformat()} at commit {records.commit()}). The runs were trained on "
             f"{each('date')} at commit {each('commit')}, on {each('machine')}, in {each('precision')}; "
             f"each run's figures, with its machine, date and commit, are in "
             f"[{os.path.basename(ledger)}]({os.path.relpath(ledger, os.path.dirname(path) or '.')})."
             + (f" Runs not finished yet: {unfinished[0]} of the {unfinished[1]} the table trains; a row with fewer "
                f"seeds is the mean of those that have, and `python ablate.py "
                f"{' '.join(a for a in argv if a != '--report')}` trains the rest." if unfinished[0] else ""),
             "", f"![Each row's difference to the preset, with the margin the rule needs]"
                 f"({os.path.relpath(picture, os.path.dirname(path) or '.')})",
             "", "| row | what changes | settings | seeds | dev BLEU greedy | dev BLEU beam (mean ± sd) | dev loss | "
                 f"minutes | {columns} |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, row in rows.items():
        train_args, eval_args, what = variants[name]
        settings = " ".join(train_args + eval_args) or "(none)"
        minutes = "" if row["minutes"] is None else f"{row['minutes']:.1f}"
        if table == "recipes":
            ratio = "" if row["ratio"] is None else f"{row['ratio']:.2f}"
            last = f"{ratio} | {row['difference']:+.2f} | {row['verdict']}"
        else:
            margin_ = "" if name == BASELINE else " ± —" if math.isinf(row["margin"]) else f" ± {row['margin']:.2f}"
            last = (f"{row['difference']:+.2f}{margin_} | {row['verdict']} | "
                    f"{', '.join(f'{p:.3f}' for p in row.get('bootstrap', []))}")
        lines.append(f"| {name} | {what} | `{settings}` | {row['seeds']} | {row['greedy']:.2f} | {row['beam']:.2f} ± "
                     f"{row['sd']:.2f} | {row['loss']:.3f} | {minutes} | {last} |")
    write_text(path, "\n".join(lines) + "\n" + kept_sections(path))


def write_record(path, rows, args, seeds, argv, unfinished):
    """The table's rows as a record: each row's settings, seeds, means, minutes, time ratio,
    difference and verdict, with where and when its runs trained."""
    variants = TABLES[args.table][0]
    kept = ("seeds", "greedy", "beam", "sd", "loss", "minutes", "ratio", "difference", "paired", "low", "bootstrap",
            "verdict", "precision", "commit", "date", "machine")
    figures = dict(table=args.table, preset=args.preset, seeds=seeds, unfinished=unfinished[0],
                   **(dict(target_ratio=TARGET_RATIO, target_bleu=TARGET_BLEU) if args.table == "recipes" else {}),
                   rows=[dict(name=name, what=what, settings=" ".join(train_args + eval_args),
                              **{key: row[key] for key in kept})
                         for name, row in rows.items() for train_args, eval_args, what in [variants[name]]])
    records.write(path, records.make(args.table, figures, ", ".join(rows[BASELINE]["precision"]),
                                     command=" ".join(["ablate.py", *argv]), machine=runs_machine(rows)))


def runs_machine(rows):
    """The machine every run of the rows trained on, as a record names it: the fields kept with the
    runs, or this machine's where they trained here before the ledger kept fields; a UserError where
    they trained on several machines or on another one, which a record cannot name."""
    here = machine()
    named = [fields or (records.machine_fields() if line == here else None)
             for row in rows.values() for line, fields in row["machines"]]
    if None in named or any(fields != named[0] for fields in named):
        raise UserError("the runs trained on " + "; ".join(sorted({m for row in rows.values() for m in row["machine"]}))
                        + ": a record names one machine; give --only the rows of one machine's runs, or write "
                          "the table on the machine they trained on")
    return named[0]


def kept_sections(path):
    """The part of an existing table document from its first `## ` heading on (sections written by
    hand, such as the comparison with the reference's code), with a blank line before it."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        return ""
    found = re.search(r"^## ", text, re.M)
    return "\n" + text[found.start():] if found else ""


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog="Settings after the options (--name value) apply to every run.")
    parser.add_argument("--preset", default="multi30k", choices=sorted(hyperparams.PRESETS),
                        help="the preset whose variants run (default multi30k)")
    parser.add_argument("--table", default="ablations", choices=sorted(TABLES),
                        help="the rows to train: ablations (VARIANTS, judged by RULE, after the recipe TABLE_BASE "
                             "pins), current (VARIANTS against the preset as it is) or recipes (RECIPES: shorter "
                             "trainings of the preset, judged by TARGET) (default ablations)")
    parser.add_argument("--only", metavar="NAMES", help="comma-separated variants to run (the preset's own "
                                                        "runs always); default every one")
    parser.add_argument("--seeds", help="comma-separated seeds: each variant trains once per seed (default 1,2; "
                                        "recipes 1,2,3)")
    parser.add_argument("--more_seeds", metavar="SEEDS",
                        help="comma-separated seeds trained only where the rule asks for them: for a row whose "
                             "difference passes with fewer seeds than the rule needs, and for the preset (default "
                             f"{','.join(map(str, range(3, MIN_SEEDS + 1)))}; recipes: none; '' for none)")
    parser.add_argument("--runs", metavar="PATH", help="where the runs go (default log/<table>/<preset>)")
    parser.add_argument("--output", metavar="PATH",
                        help="the table to write (default <runs>/<table>.md; the shipped docs/ablations.md "
                             "is rewritten only when named here); its picture is written beside it (<name>.png)")
    parser.add_argument("--ledger", metavar="PATH",
                        help="where each run's figures are kept (default: beside the table, <output>.json): a "
                             "run recorded there is not trained again")
    parser.add_argument("--report", action="store_true",
                        help="train nothing: write the table from the runs that have finished (a row "
                             "with fewer seeds says so), e.g. while another call is still training")
    parser.add_argument("--record", metavar="PATH",
                        help="also write the table's rows as a record (support/records.py) for bench/tables.py "
                             "to draw in docs/results.md")
    args, extra = parser.parse_known_args(argv)
    variants, _, default_seeds = TABLES[args.table]
    names = [BASELINE] + [n for n in (args.only.split(",") if args.only else variants) if n != BASELINE]
    unknown = [n for n in names if n not in variants]
    if unknown:
        raise UserError(f"--only: unknown variant {', '.join(unknown)}; choose from {', '.join(variants)}")
    if args.more_seeds is None:
        args.more_seeds = "" if args.table == "recipes" else ",".join(map(str, range(3, MIN_SEEDS + 1)))
    seeds = seed_list("--seeds", default_seeds if args.seeds is None else args.seeds)
    more_seeds = seed_list("--more_seeds", args.more_seeds)
    if not seeds:
        raise UserError("--seeds: give at least one seed, e.g. 1,2")
    if set(seeds) & set(more_seeds):
        raise UserError(f"--more_seeds {args.more_seeds}: give seeds that --seeds "
                        f"({','.join(map(str, seeds))}) does not")
    runs = args.runs or os.path.join("log", args.table, args.preset)
    output = args.output or os.path.join(runs, f"{args.table}.md")
    ledger = read_ledger(args.ledger or os.path.splitext(output)[0] + ".json")
    results, asked = {name: [] for name in names}, {name: list(seeds) for name in names}

    def measure_all(todo):  # [(variant, seed)]: each run's figures into results
        for done, (name, seed) in enumerate(todo, 1):
            print(f"[{done}/{len(todo)}] {name}, seed {seed}", flush=True)
            run = measure(args.preset, name, seed, runs, extra, ledger, report_only=args.report, table=args.table)
            if run is None:
                print("    not trained yet: left out of the table")
            else:
                results[name].append(dict(run, seed=seed))

    measure_all([(name, seed) for name in names for seed in seeds])
    while True:  # more seeds for the rows that need them (and the preset), until none asks again
        if not results[BASELINE]:
            raise UserError(f"no finished run of the preset itself in {runs}: nothing to compare with "
                            f"(run ablate.py without --report first)")
        rows = summarize({name: figures for name, figures in results.items() if figures}, args.table)
        more = [name for name, row in rows.items() if row["verdict"].endswith(NEEDS_MORE)]
        todo = [(name, seed) for name in ([BASELINE] + more if more else []) for seed in more_seeds
                if seed not in asked[name]]
        if not todo:
            break
        print(f"the rule asks for more seeds of {', '.join(more)} (and the preset's): seeds "
              f"{', '.join(map(str, more_seeds))}", flush=True)
        for name, seed in todo:
            asked[name].append(seed)
        measure_all(todo)
    picture = os.path.splitext(output)[0] + ".png"
    plot_ablations(rows, picture)
    total = sum(len(s) for s in asked.values())
    unfinished = (total - sum(len(figures) for figures in results.values()), total)
    write_table(output, picture, ledger["path"], rows, args.preset, seeds, more_seeds, argv, unfinished, args.table)
    print(f"wrote {output} and {picture}")
    if args.record:
        write_record(args.record, rows, args, seeds, argv, unfinished)
        print(f"wrote the rows to {args.record}")
    for name, row in rows.items():
        print(f"{name:22s} beam {row['beam']:6.2f}  {row['difference']:+6.2f}  {row['verdict']}")


if __name__ == "__main__":
    run_cli(main)

"""The reference's own code, run as published beside the port: Kyubyong Park's `transformer` at
commit fb023bb (master, 2019-09-24), its train.py unedited, on today's TensorFlow.

    python reference.py train --reference_dir ../kyubyong-transformer --prepro_dir prepro/multi30k \\
        --workdir log/reference/multi30k -- --num_epochs 20 --d_model 256 --d_ff 1024 --num_blocks 3 \\
        --num_heads 4
    python reference.py convert --ckpt log/reference/multi30k/log/1/iwslt2016_E20L2.50-4540 \\
        --prepro_dir prepro/multi30k --logdir log/from_reference
    python reference.py export --logdir log/from_reference --prepro_dir prepro/multi30k \\
        --workdir log/to_reference --reference_dir ../kyubyong-transformer
    python reference.py check --prepro_dir prepro/sample --workdir log/reference/check \\
        --reference_dir ../kyubyong-transformer
    python reference.py curves --prepro_dir prepro/multi30k --workdir log/reference/curves \\
        --reference_dir ../kyubyong-transformer -- --warmup_steps 1000
    python reference.py curves --draw --workdir docs/reference_curves

`train` does this:
  - writes the ids of --prepro_dir (prepro.py's, the port's own) in the reference's input format
    into <workdir>/data/: its --train1/--train2/--eval1/--eval2 files (sentencepiece pieces
    separated by spaces, one sentence a line), --eval3 (the raw dev target text, which its BLEU
    is scored against) and --vocab (one piece a line, in id order);
  - runs the reference's train.py in <workdir>, in a process of its own where the substitutions of
    SUBSTITUTIONS (and only those) are made before the reference's first line runs, with those
    file arguments, --vocab_size, and the arguments after `--` passed on as they are.
The reference then writes what it always wrote, relative to <workdir>: log/1/ (checkpoints and
TensorBoard summaries; --logdir) and eval/1/ (each epoch's dev translations ending with their
multi-bleu.perl line; --evaldir). Its multi-bleu.perl is linked into <workdir>, where it runs it.

Without --reference_dir the public repository is cloned at that commit into <workdir>/code (git
and the network needed). The reference's code needs tf_keras (`bash setup.sh dev` installs it).

`export` goes the other way: a port run of the reference's choices (a converted one, or one trained
with the iwslt2016 preset) becomes a checkpoint of the reference's code, built and saved by that
code in its own process, which the reference's test.py restores.

`check` is the equality report, in about four minutes: the reference's code and the port, from the
same random weights at two small sizes, give the same logits, layer norm, losses and weights over
five training steps, the same dropout statistics, the same batches from its own data_load, the same
greedy translations, and the same BLEU (report.check() says how each is compared and within what).

`curves` reproduces it all: the equality report first, on the ids it trains on (it stops there if a
row fails), then the reference's train.py and the port's multi30k_reference preset side by side (two
runs a side by default, hours on a CPU: docs/ablations.md says how many), and it draws their
training loss and dev BLEU by epoch in one picture, with a table and a verdict (reference_history
reads the reference's own summaries and translation files). Each run keeps its epochs in its
history.jsonl; `curves --draw` trains nothing and draws the runs as far as they have gone, and a run
finished on another machine joins by copying its history.jsonl into the same place under --workdir.

`convert` makes a run folder of the port from a reference checkpoint (the prefix its tf.train.Saver
wrote; its hparams file beside it gives the sizes): the iwslt2016 preset (every choice of the
reference's 2019 code) at the checkpoint's sizes, its weights in ckpt/ as an epoch checkpoint, and
--prepro_dir's vocabulary, which must be the one the reference trained with (`train` above wrote
its files from it). eval.py, translate.py, attention.py and export.py then use it as a run the port
trained. The port's outputs equal the reference's for the same weights (tests/test_reference.py;
PORTING.md says what differs and why it changes nothing at real tokens).
"""
import argparse
import dataclasses
import os
import sys

import hyperparams
from reference_bridge.curves import CURVES_PRESET, curves
from reference_bridge.launch import COMMIT, REPOSITORY, SUBSTITUTIONS, reference_code, train_reference, write_inputs
from reference_bridge.report import equality_report
from reference_bridge.weights import convert, to_reference
from support.utils import run_cli


def reference_dir_option(parser):
    parser.add_argument("--reference_dir", metavar="PATH",
                        help=f"a clone of {REPOSITORY} at commit {COMMIT[:7]} (default: cloned into <workdir>/code)")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    own, rest = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Substitutions made in the reference's process: "
               + "; ".join(f"{name} -> {what}" for name, what in SUBSTITUTIONS))
    commands = parser.add_subparsers(dest="command", required=True)
    train = commands.add_parser("train", help="run the reference's train.py on prepro.py's ids",
                                epilog="Arguments after -- go to the reference's train.py (its hparams.py lists them).")
    reference_dir_option(train)
    train.add_argument("--prepro_dir", required=True, metavar="PATH", help="prepro.py's output to train on")
    train.add_argument("--workdir", required=True, metavar="PATH",
                       help="where the reference runs: its data/, log/1/ and eval/1/ go there")
    to_port = commands.add_parser("convert", help="a reference checkpoint as a run folder of the port")
    to_port.add_argument("--ckpt", required=True, metavar="PREFIX",
                         help="the checkpoint's prefix, e.g. log/1/iwslt2016_E20L2.50-4540 (its hparams file "
                              "beside it)")
    to_port.add_argument("--prepro_dir", required=True, metavar="PATH", help="the prepro.py folder it was trained on")
    to_port.add_argument("--logdir", required=True, metavar="PATH", help="the run folder to write")
    to_reference_parser = commands.add_parser("export", help="a port run (of the reference's choices) as a reference "
                                                             "checkpoint")
    to_reference_parser.add_argument("--logdir", required=True, metavar="PATH", help="the port's run folder")
    to_reference_parser.add_argument("--prepro_dir", required=True, metavar="PATH",
                                     help="the prepro.py folder it was trained on")
    to_reference_parser.add_argument("--workdir", required=True, metavar="PATH",
                                     help="where the checkpoint (ckpt/port-<step>) and the reference's data go")
    reference_dir_option(to_reference_parser)
    checker = commands.add_parser("check", help="the equality report: the reference's code and the port from the "
                                                "same random weights compute the same numbers (minutes)")
    checker.add_argument("--prepro_dir", required=True, metavar="PATH",
                         help="prepro.py's output whose data the check uses (e.g. the sample's)")
    checker.add_argument("--workdir", required=True, metavar="PATH", help="where its files go")
    reference_dir_option(checker)
    curves_parser = commands.add_parser(
        "curves", help=f"the equality report on --prepro_dir's ids (as check), then the reference's train.py and "
                       f"the port's --preset {CURVES_PRESET}, the same runs a side, their curves in one picture "
                       f"and table (hours)",
        epilog=f"Arguments after -- go to both sides' training (settings both take: e.g. --warmup_steps 1000); "
               f"the reference gets the {CURVES_PRESET} preset's sizes and batch of sentences. Stopped, it "
               f"starts again where it was: finished runs are kept, and each side resumes from its newest "
               f"checkpoint.")
    curves_parser.add_argument("--prepro_dir", metavar="PATH",
                               help="prepro.py's output to train on (the preset's: prepro/multi30k); with --draw, "
                                    "needed only to read a reference run that has its logs and no finished "
                                    "history.jsonl")
    curves_parser.add_argument("--workdir", required=True, metavar="PATH",
                               help="where the runs (reference/run<N>, port/seed<N>), curves.png and curves.md go")
    curves_parser.add_argument("--runs", type=int, default=2, metavar="N", help="runs a side (default 2)")
    curves_parser.add_argument("--draw", action="store_true",
                               help="train nothing: draw curves.png and curves.md from the runs in --workdir as far "
                                    "as they have gone (their history.jsonl, or a reference run's logs)")
    reference_dir_option(curves_parser)
    args = parser.parse_args(own)
    if args.command == "curves" and args.runs < 1:
        parser.error("--runs must be at least 1")
    if args.command == "curves" and not args.draw and not args.prepro_dir:
        parser.error("curves needs --prepro_dir (the ids to train on), unless it only draws (--draw)")
    if args.command == "curves" and args.draw:
        if rest:
            parser.error("curves --draw trains nothing and takes no arguments after --")
        curves(None, args.prepro_dir, args.workdir, args.runs, [], draw=True)
        return
    if args.command == "check":
        if rest:
            parser.error("check takes no arguments after --")
        os.makedirs(args.workdir, exist_ok=True)
        return 1 if equality_report(reference_code(args.reference_dir, args.workdir), args.prepro_dir,
                                    args.workdir) else 0
    if args.command == "export":
        from trained import runs

        if rest:
            parser.error("export takes no arguments after --")
        hp = dataclasses.replace(hyperparams.load_hparams(args.logdir), logdir=args.logdir, kernels="plain")
        model, _, ckpt = runs.load_trained(hp)
        os.makedirs(args.workdir, exist_ok=True)
        prefix = to_reference(model, hp, args.prepro_dir, reference_code(args.reference_dir, args.workdir),
                              args.workdir)
        print(f"{ckpt} -> {prefix} (the reference's test.py restores it: --ckpt {prefix})")
        return
    if args.command == "convert":
        if rest:
            parser.error("convert takes no arguments after --")
        convert(args.ckpt, args.prepro_dir, args.logdir)
        return
    os.makedirs(args.workdir, exist_ok=True)
    code = reference_code(args.reference_dir, args.workdir)
    if args.command == "curves":
        curves(code, args.prepro_dir, args.workdir, args.runs, rest)
        return
    train_reference(code, write_inputs(args.prepro_dir, os.path.join(args.workdir, "data")), args.workdir, rest)


if __name__ == "__main__":
    sys.exit(run_cli(main))

"""What the benchmarks share: a command line with --preset, --prepro_dir and --seed."""
import argparse

import hyperparams


def parser(doc):
    """An ArgumentParser described by the first paragraph of doc, with the shared options."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--preset", default="multi30k", choices=sorted(hyperparams.PRESETS))
    p.add_argument("--prepro_dir", help="prepro.py's output (default: the preset's)")
    p.add_argument("--seed", type=int, default=0)
    return p


def parse(p, argv):
    """(args, the preset's Hparams with --prepro_dir applied)."""
    args = p.parse_args(argv)
    hp = hyperparams.preset(args.preset)
    if args.prepro_dir:
        hp.prepro_dir = args.prepro_dir
    return args, hp

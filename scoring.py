"""BLEU two ways, and the results file that ends with the scores: used by eval.py, and by train.py
for the dev BLEU after every epoch.

sacreBLEU (cased, detokenized, 13a, with its signature) is the score to compare with others; the
reference's way (multi-bleu.perl on cased, whitespace-split text = sacreBLEU with tokenize="none")
is the one to compare with the reference's published figures.
"""
from utils import atomic_write


def bleu_scores(hypotheses, references):
    """Corpus BLEU of detokenized hypotheses against one reference each.

    Returns:
      dict: sacrebleu (13a, cased) score and signature; reference (tokenize none, as the
      reference's multi-bleu.perl on raw text) score and signature.
    """
    from sacrebleu.metrics import BLEU

    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references")
    out = {}
    for key, tokenize in (("sacrebleu", "13a"), ("reference", "none")):
        metric = BLEU(tokenize=tokenize)
        out[key] = metric.corpus_score(hypotheses, [references]).score
        out[key + "_signature"] = str(metric.get_signature())
    return out


def read_hypotheses(path):
    """One translation per line; a trailing `BLEU = ...` line (the reference's result files) is dropped."""
    with open(path, encoding="utf-8") as f:
        return [line for line in f.read().splitlines() if not line.startswith("BLEU = ")]


def format_scores(scores, split, extra=""):
    """The two BLEU lines eval.py ends with."""
    return (f"BLEU {split} sacreBLEU = {scores['sacrebleu']:.2f} ({scores['sacrebleu_signature']}){extra}\n"
            f"BLEU {split} reference's way (multi-bleu, whitespace tokens) = {scores['reference']:.2f} "
            f"({scores['reference_signature']}){extra}")


def write_results(path, sources, references, hypotheses, score_text):
    """Results file: source / expected / got for every sentence, then the scores."""
    with atomic_write(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            for s, r, h in zip(sources, references, hypotheses):
                f.write(f"- source: {s}\n- expected: {r}\n- got: {h}\n\n")
            f.write(score_text + "\n")

"""BLEU two ways, and the results file that ends with the scores: used by eval.py, and by train.py
for the dev BLEU after every epoch.

sacreBLEU (cased, detokenized, 13a, with its signature) is the score to compare with others; the
reference's way (multi-bleu.perl on cased, whitespace-split text = sacreBLEU with tokenize="none")
is the one to compare with the reference's published figures.
"""
from support.utils import atomic_write

# sacreBLEU's tokenizer for a target language: 13a splits at spaces and punctuation, which finds no
# words in languages written without spaces; Chinese has its own, the others are scored on characters
# (its signature says tok:char; sacreBLEU's ja-mecab and ko-mecab need MeCab, not installed here).
TOKENIZERS = {"zh": "zh", "ja": "char", "ko": "char", "th": "char", "my": "char", "km": "char", "lo": "char"}


def bleu_scores(hypotheses, references, language="en"):
    """Corpus BLEU of detokenized hypotheses against one reference each, in the target language
    `language` (an ISO 639-1 code: TOKENIZERS).

    Returns:
      dict: sacrebleu (13a or the language's tokenizer, cased) score and signature; reference (tokenize none, as the
      reference's multi-bleu.perl on raw text) score and signature; reference_report, the line
      multi-bleu.perl prints for that score.
    """
    from sacrebleu.metrics import BLEU

    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references")
    out = {}
    # multi-bleu.perl does not smooth: a corpus without a matching 4-gram scores 0
    for key, tokenize, smooth in (("sacrebleu", TOKENIZERS.get(language, "13a"), "exp"), ("reference", "none", "none")):
        metric = BLEU(tokenize=tokenize, smooth_method=smooth)
        score = metric.corpus_score(hypotheses, [references])
        out[key], out[key + "_signature"] = score.score, str(metric.get_signature())
    out["reference_report"] = multi_bleu_report(score)
    return out


def multi_bleu_report(score):
    """A sacrebleu BLEUScore as the reference's multi-bleu.perl prints it, its "ration" included:
    `BLEU = 23.88, 54.0/30.7/18.6/11.7 (BP=0.974, ration=0.974)`."""
    precisions = "/".join(f"{p:.1f}" for p in score.precisions)
    ratio = score.sys_len / max(score.ref_len, 1)
    return f"BLEU = {score.score:.2f}, {precisions} (BP={score.bp:.3f}, ration={ratio:.3f})"


def paired_bootstrap(baseline, system, references, language="en", resamples=1000):
    """sacreBLEU's paired bootstrap resampling (Koehn, 2004) of two systems' outputs for the same
    sentences: the p-value of a BLEU difference as large as theirs arising by chance (1.0 where the
    outputs are the same). sacreBLEU fixes its own seed (SACREBLEU_SEED), so the figure repeats."""
    import logging

    from sacrebleu.metrics import BLEU
    from sacrebleu.significance import PairedTest

    if list(system) == list(baseline):
        return 1.0
    metric = BLEU(tokenize=TOKENIZERS.get(language, "13a"))
    logger, level = logging.getLogger("sacrebleu"), logging.getLogger("sacrebleu").level
    logger.setLevel(logging.WARNING)  # its progress lines
    try:
        _, results = PairedTest([("baseline", baseline), ("system", system)], {"BLEU": metric}, [references],
                                test_type="bs", n_samples=resamples)()
    finally:
        logger.setLevel(level)
    return results["BLEU"][1].p_value


def read_hypotheses(path):
    """One translation per line; a trailing `BLEU = ...` line (the reference's result files) is dropped."""
    with open(path, encoding="utf-8") as f:
        return [line for line in f.read().splitlines() if not line.startswith("BLEU = ")]


def format_scores(scores, split, extra=""):
    """The two BLEU lines eval.py ends with."""
    return (f"BLEU {split} sacreBLEU = {scores['sacrebleu']:.2f} ({scores['sacrebleu_signature']}){extra}\n"
            f"BLEU {split} reference's way (multi-bleu, whitespace tokens) = {scores['reference']:.2f} "
            f"({scores['reference_signature']}){extra}")


def write_hypotheses(path, hypotheses, report):
    """The reference's results file: one translation per line, then its multi-bleu.perl line."""
    with atomic_write(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write("\n".join(hypotheses) + "\n" + report + "\n")


def write_results(path, sources, references, hypotheses, score_text):
    """Results file: source / expected / got for every sentence, then the scores."""
    with atomic_write(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            for s, r, h in zip(sources, references, hypotheses):
                f.write(f"- source: {s}\n- expected: {r}\n- got: {h}\n\n")
            f.write(score_text + "\n")

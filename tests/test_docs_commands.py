"""The documents' commands work as written: every fenced shell and Python block of README.md and
docs/*.md runs on the sample data (tests/docs_commands.py says what is substituted and what is
skipped, and why), and fails on a non-zero exit, a traceback, or an option a script refuses."""
import json
import os
import re

import pytest

import docs_commands
from conftest import ROOT, assert_one_line_error, run_script

BLOCKS = docs_commands.blocks()


@pytest.mark.slow
@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_the_documents_commands_run(block, checkouts):
    why = block.skipped()
    if why:
        pytest.skip(why)
    for command, run in checkouts(block.document).run(block):
        assert run.returncode == 0 and "Traceback" not in run.stderr, \
            f"{block.id}: {command}\nexit {run.returncode}\n{run.stdout[-1500:]}\n{run.stderr[-3000:]}"


def outputs(checkouts, document, words):
    """stdout of the commands of `document` that contain `words`, after the document has run."""
    checkout = checkouts(document).run_all()
    return checkout, [run.stdout for block in checkout.done for command, run in checkout.done[block]
                      if words in command]


@pytest.mark.slow
def test_the_own_corpus_recipes_ask_for_a_real_vocabulary_and_take_thousands_of_characters(checkouts):
    """your_data.md's Japanese recipe is README's with the names and languages changed; typed as
    written it takes a corpus with thousands of distinct characters, and the English-French one asks
    sentencepiece for the 8000 pieces a real corpus needs."""
    checkout, prepro = outputs(checkouts, "docs/your_data.md", "prepro.py")
    assert all("(asked for 8000)" in out for out in prepro) and len(prepro) == 2
    with open(os.path.join(checkout.path, "my_ja_en", "train.ja"), encoding="utf-8") as f:
        characters = len(set(f.read()) - {"\n"})
    with open(os.path.join(checkout.path, "prepro", "ja-en", "meta.json"), encoding="utf-8") as f:
        meta = json.load(f)
    assert characters > 2000 and meta["vocab_size"] > characters and meta["src_lang"] == "ja"
    _, translations = outputs(checkouts, "docs/your_data.md", "translate.py")
    assert all(len(out.splitlines()) == 1 and out.strip() for out in translations) and len(translations) == 2


@pytest.mark.slow
def test_the_languages_given_to_prepro_reach_every_later_step(checkouts):
    """Training takes the pair from the prepro folder and saves it; eval scores Japanese sources
    into English with the tokenizer English needs; a language flag that is not the folder's is
    refused, naming both."""
    checkout = checkouts("docs/your_data.md").run_all()
    with open(os.path.join(checkout.path, "log", "ja-en", "hparams.json"), encoding="utf-8") as f:
        saved = json.load(f)
    assert (saved["src_lang"], saved["tgt_lang"]) == ("ja", "en")
    run = run_script(os.path.join(checkout.path, "eval.py"), "--logdir", "log/ja-en", cwd=checkout.path)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "BLEU test sacreBLEU" in run.stdout and "tok:13a" in run.stdout
    assert_one_line_error(run_script(os.path.join(checkout.path, "train.py"), "--prepro_dir", "prepro/ja-en",
                                     "--logdir", "log/other", "--src_lang", "de", cwd=checkout.path),
                          r"made for ja->en: --src_lang de \(the folder holds ja\)")


@pytest.mark.slow
def test_the_recipes_outputs_are_where_the_documents_say(checkouts):
    readme = checkouts("README.md").run_all().path
    with open(os.path.join(readme, "en.txt"), encoding="utf-8") as f:
        translated = f.read().splitlines()
    with open(os.path.join(ROOT, "corpora", "sample", "test.de"), encoding="utf-8") as f:
        assert len(translated) == len(f.read().splitlines())  # one line out per line in
    assert os.path.isfile(os.path.join(readme, "attention.png"))
    assert os.path.isfile(os.path.join(readme, "exported", "sample-ct2", "model.bin"))
    # the ablation recipe writes its table beside its runs; the shipped docs/ablations.md is not touched
    assert os.path.isfile(os.path.join(readme, "log", "ablations", "multi30k", "ablations.md"))
    assert not os.path.exists(os.path.join(readme, "docs", "ablations.md"))
    using = checkouts("docs/using.md").run_all().path
    assert os.path.isfile(os.path.join(using, "log", "multi30k", "history.png"))


def test_demo_sh_is_the_quick_start_and_ci_runs_the_readmes_test_commands():
    def commands(text):
        return [line.split("#")[0].split() for line in text.splitlines()
                if line.startswith(".venv/bin/python")]
    quick = docs_commands.quick_start_block()
    with open(os.path.join(ROOT, "demo.sh"), encoding="utf-8") as f:
        assert commands(f.read()) == commands(quick.text)
    test_block = next(b for b in BLOCKS if "bash test.sh" in b.text and b.document == "README.md")
    tiers = [command.split("#")[0].strip() for command in test_block.commands()]
    assert tiers == ["bash test.sh", "bash test.sh slow"]
    with open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8") as f:
        assert f.read().strip().splitlines()[-2:] == tiers


def test_the_runner_substitutes_what_it_says_and_nothing_else():
    sub = docs_commands.substitute
    assert sub(".venv/bin/python train.py --preset sample").endswith("train.py --preset sample")
    assert re.search(r"train\.py --preset multi30k --num_epochs 1 --d_model 32 .*--num_heads 2$",
                     sub(".venv/bin/python train.py  --preset multi30k"))
    assert sub(".venv/bin/python prepro.py --preset iwslt2016 --download   # ~190 MB").endswith(
        "prepro.py --preset iwslt2016")
    piped = sub('echo "Ein Mann fährt Fahrrad." | .venv/bin/python translate.py --preset sample')
    assert piped.startswith("echo 'Ein Mann fährt Fahrrad.' | ") and piped.endswith("translate.py --preset sample")
    assert sub("KERAS_BACKEND=jax python eval.py --logdir log/x").startswith("KERAS_BACKEND=jax ")
    ids = [b.id for b in BLOCKS]
    assert len(ids) >= 20 and any(b.skipped() and "Archive" in b.skipped() for b in BLOCKS)
    assert sum(1 for b in BLOCKS if not b.skipped()) >= 17


def test_a_skip_skips_one_command_not_its_block():
    block = docs_commands.Block("x.md", 1, "", "shell", "export TF_CONFIG='{}'\necho ran\n", "bash")
    assert block.command_skipped("export TF_CONFIG='{}'") and not block.command_skipped("echo ran")
    assert block.skipped() is None  # the block runs: its other command


def test_every_fenced_block_says_its_language():
    untagged = [b.id for b in BLOCKS if not b.tag]
    assert not untagged, f"blocks with no language tag (bash or python to run them, text for a listing): {untagged}"
    other = [b for b in BLOCKS if b.language is None]
    assert all(b.skipped() for b in other)  # reported as not run, with the reason, never dropped


def test_every_inline_command_is_run_or_listed_with_its_reason():
    """A command written in the prose (`python ...` in backticks) equals a fenced command, which
    runs, or matches a rule of INLINE_NOT_RUN, which says why not; no rule is left matching nothing."""
    found = docs_commands.inline_commands()
    assert len(found) >= 50 and any(c == ".venv/bin/tensorboard --logdir log/multi30k/tensorboard" for _, _, c in found)
    fenced = docs_commands.fenced_commands()
    unaccounted = [f"{d}:{line}: `{c}`" for d, line, c in found
                   if docs_commands.inline_verdict(d, c, fenced) == (False, None)]
    assert not unaccounted, ("commands in the prose that are neither run nor listed in "
                             "docs_commands.INLINE_NOT_RUN:\n" + "\n".join(unaccounted))
    used = {why for d, _, c in found for runs, why in [docs_commands.inline_verdict(d, c, fenced)] if not runs}
    assert {why for _, _, why in docs_commands.INLINE_NOT_RUN} <= used, "a rule of INLINE_NOT_RUN matches nothing"
    report = docs_commands.report()
    assert len(report) == len(found) + sum(max(1, len(b.commands())) for b in BLOCKS)
    assert not any("NOT ACCOUNTED FOR" in line for line in report)

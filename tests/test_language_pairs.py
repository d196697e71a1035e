"""Any language pair: the languages are given once, to prepro.py, and every later step reads them
(the whole recipe runs in tests/test_docs_commands.py, as docs/your_data.md gives it)."""
import dataclasses

from conftest import ENGLISH, assert_one_line_error, run_script

JAPANESE = ["男性が自転車に乗っている。", "女性が本を読んでいる。", "子供が公園で遊んでいる。",
            "二匹の犬が浜辺を走っている。", "少女が水を飲んでいる。", "先生が窓を開ける。"]


def write_corpus(directory, src_lang, src, tgt_lang, tgt):
    """{train,dev,test}.<lang> files: the names a user's own corpus has."""
    directory.mkdir(parents=True, exist_ok=True)
    for split, rows in (("train", slice(None)), ("dev", slice(0, 3)), ("test", slice(3, None))):
        times = 5 if split == "train" else 1
        for lang, lines in ((src_lang, src), (tgt_lang, tgt)):
            (directory / f"{split}.{lang}").write_text("".join(x + "\n" for x in lines[rows] * times), encoding="utf-8")


def test_a_missing_train_de_says_how_to_name_other_languages(tmp_path):
    write_corpus(tmp_path / "raw", "ja", JAPANESE, "en", ENGLISH)
    run = run_script("prepro.py", "--data_dir", str(tmp_path / "raw"), "--prepro_dir", str(tmp_path / "p"))
    assert_one_line_error(run, r"missing corpus files train\.de\[\.gz\].*train\.<lang>.*--src_lang and --tgt_lang")


def test_multi30k_names_and_plain_names_are_both_found(tmp_path):
    """val / test_2016_flickr with the default prefixes, and dev / test with the multi30k preset's."""
    import hyperparams
    import prepro
    from conftest import GERMAN
    raw = tmp_path / "raw"
    raw.mkdir()
    for prefix in ("train", "val", "test_2016_flickr"):
        for lang, lines in (("de", GERMAN), ("en", ENGLISH)):
            (raw / f"{prefix}.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    files = prepro.corpus_files(hyperparams.Hparams(data_dir=str(raw)))
    assert [files[s][1].rsplit("/", 1)[1] for s in prepro.SPLITS] == ["train.de", "val.de", "test_2016_flickr.de"]
    for prefix, plain in (("val", "dev"), ("test_2016_flickr", "test")):
        for lang in ("de", "en"):
            (raw / f"{prefix}.{lang}").rename(raw / f"{plain}.{lang}")
    files = prepro.corpus_files(dataclasses.replace(hyperparams.preset("multi30k"), data_dir=str(raw)))
    assert [files[s][2].rsplit("/", 1)[1] for s in prepro.SPLITS] == ["train.en", "dev.en", "test.en"]


def test_bleu_tokenizes_languages_without_spaces():
    from support.scoring import bleu_scores
    assert "tok:13a" in bleu_scores(["A dog runs."], ["A dog runs."], "en")["sacrebleu_signature"]
    assert "tok:char" in bleu_scores(["犬が走る。"], ["犬が走る。"], "ja")["sacrebleu_signature"]
    assert "tok:zh" in bleu_scores(["狗在跑。"], ["狗在跑。"], "zh")["sacrebleu_signature"]

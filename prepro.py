"""Turn a raw parallel corpus (German-English by default, any language pair) into a joint BPE
vocabulary and id files.

    python prepro.py --preset sample
    python prepro.py --preset multi30k --data_dir ../shared/data/multi30k
    python prepro.py --preset iwslt2016 --download
    python prepro.py --data_dir my_corpus --src_lang en --tgt_lang fr --prepro_dir prepro/en-fr --vocab_size 8000

Reads (see Hparams.corpus):
  parallel  line-aligned <prefix>.<lang>[.gz] files, as Multi30k ships them;
  iwslt     the IWSLT 2016 (or 2017) TED release: train.tags.<pair>.<lang> with its tag lines
            dropped, and the <seg> texts of IWSLT1x.TED.<set>.<pair>.<lang>.xml; dev = tst2013,
            test = tst2014, as the reference.
Every sentence is cleaned (`clean`): Unicode NFKC, byte-order marks and control characters dropped,
whitespace runs made one space. A training pair with an empty side is dropped (and counted); dev and
test keep every line, so references stay aligned.
Writes to --prepro_dir: bpe.model/bpe.vocab (sentencepiece BPE, ids 0 <pad> 1 <unk> 2 <s> 3 </s>),
<split>.npz (token ids of both sides), <split>.<lang> (the raw sentences, for BLEU) and meta.json.
"""
import gzip
import hashlib
import json
import os
import re
import shutil
import tarfile
import tempfile
import urllib.request
import xml.parsers.expat
import zlib

import numpy as np
from tqdm import tqdm

import hyperparams
from data_load import clean
from support.utils import UserError, check_writable, run_cli, section

SPLITS = ("train", "dev", "test")
# Other names a split's files go by (parallel corpora), tried when --<split>_prefix's are missing:
# {train,dev,test}.<lang> and Multi30k's val / test_2016_flickr are both found with either preset.
PREFIX_ALTERNATIVES = {"train": ("train",), "dev": ("dev", "val", "valid"), "test": ("test", "test_2016_flickr")}
IWSLT_SETS = {"dev": "tst2013", "test": "tst2014"}
# A line of train.tags.* that begins with an XML tag (<url>, <talkid>, <keywords>, <speaker>, <title>,
# <description>, <reviewer href=...>, <translator href=...>, <doc ...>, </doc>, ...) is metadata.
TAG_LINE = re.compile(r"^\s*</?[A-Za-z][\w.-]*(\s[^>]*)?/?>")

MULTI30K_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/{}"
MULTI30K_SHA256 = {
    "train.de.gz": "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6",
    "train.en.gz": "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f",
    "val.de.gz": "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a",
    "val.en.gz": "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28",
    "test_2016_flickr.de.gz": "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8",
    "test_2016_flickr.en.gz": "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9",
}
# The reference's WIT3 link is dead. torchtext's mirror of the whole IWSLT 2016 release (2016-01.tgz),
# checked against torchtext's published MD5; de-en.tgz inside it holds the de-en files.
IWSLT2016_URL = ("https://drive.usercontent.google.com/download?"
                 "id=1l5y6Giag9aRPwGtuZHswh3w5v3qEz8D8&export=download&confirm=t")
IWSLT2016_MD5 = "c393ed3fc2a1b0f004b3331043f615ae"
IWSLT2016_INNER = "2016-01/texts/de/en/de-en.tgz"


# Reading raw corpora

# The settings prepro.py uses (--help shows these)
SETTINGS = ("data", "seed")


def read_lines(path):
    """Lines of a UTF-8 text file (gzipped if it ends in .gz), without line ends.

    Raises UserError naming the file and line for bytes that are not UTF-8 or a broken gzip file.
    """
    opener = gzip.open if path.endswith(".gz") else open
    lines = []
    try:
        with opener(path, "rb") as f:
            for lineno, raw in enumerate(f, 1):
                try:
                    line = raw.decode("utf-8").rstrip("\r\n")
                    lines.append(line.lstrip("\ufeff") if lineno == 1 else line)  # byte-order mark
                except UnicodeDecodeError as e:
                    raise UserError(f"{path}:{lineno}: bytes that are not UTF-8 ({e.reason} at byte "
                                    f"{e.start}); convert the file to UTF-8 (e.g. iconv -t UTF-8)") from None
    except (EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise UserError(f"{path}:{len(lines) + 1}: broken gzip file ({e}); download it again") from None
    except FileNotFoundError:
        raise UserError(f"{path}: file not found") from None
    return lines


def read_parallel(src_path, tgt_path):
    """Line-aligned source and target sentences."""
    src, tgt = read_lines(src_path), read_lines(tgt_path)
    if len(src) != len(tgt):
        raise UserError(f"{src_path} has {len(src)} lines but {tgt_path} has {len(tgt)}: the files must be "
                        f"line-aligned translations of each other; check that both are complete")
    return [clean(s) for s in src], [clean(t) for t in tgt]


def read_iwslt_train(src_path, tgt_path):
    """Sentences of train.tags.* files without their tag lines, checked to stay aligned."""
    src, tgt = read_lines(src_path), read_lines(tgt_path)
    src_text, tgt_text = [], []
    for lineno, (s, t) in enumerate(zip(src, tgt), 1):
        s_tag, t_tag = bool(TAG_LINE.match(s)), bool(TAG_LINE.match(t))
        if s_tag != t_tag:
            tag_path = src_path if s_tag else tgt_path
            raise UserError(f"{tag_path}:{lineno}: a tag line where the other side "
                            f"({tgt_path if s_tag else src_path}) has text: the files are not aligned; "
                            f"use the two files of one release")
        if not s_tag:
            src_text.append(clean(s))
            tgt_text.append(clean(t))
    if len(src) != len(tgt):
        raise UserError(f"{src_path} has {len(src)} lines but {tgt_path} has {len(tgt)}: the files must be "
                        f"line-aligned; check that both are complete")
    return src_text, tgt_text


def read_iwslt_xml(path):
    """The <seg> texts of an IWSLT XML file, XML entities unescaped.

    Returns:
      list of (seg_key, text, line): seg_key is (docid, seg id), line where the <seg> starts.
    """
    segs, stack, doc = [], [], [None]
    parser = xml.parsers.expat.ParserCreate("UTF-8")

    def start(name, attrs):
        if name == "doc":
            doc[0] = attrs.get("docid")
        if name == "seg":
            stack.append([(doc[0], attrs.get("id")), [], parser.CurrentLineNumber])

    def end(name):
        if name == "seg" and stack:
            key, parts, line = stack.pop()
            segs.append((key, clean("".join(parts)), line))

    def text(data):
        if stack:
            stack[-1][1].append(data)

    parser.StartElementHandler, parser.EndElementHandler, parser.CharacterDataHandler = start, end, text
    try:
        with open(path, "rb") as f:
            parser.ParseFile(f)
    except FileNotFoundError:
        raise UserError(f"{path}: file not found") from None
    except xml.parsers.expat.ExpatError as e:
        raise UserError(f"{path}:{e.lineno}: not well-formed XML "
                        f"({xml.parsers.expat.ErrorString(e.code)}); the file may be cut off: "
                        f"download it again") from None
    if not segs:
        raise UserError(f"{path}: no <seg> elements; is this an IWSLT dev/test XML file?")
    return segs


def read_iwslt_pair(src_path, tgt_path):
    """Aligned <seg> texts of the source and target XML files of one set."""
    src, tgt = read_iwslt_xml(src_path), read_iwslt_xml(tgt_path)
    if len(src) != len(tgt):
        raise UserError(f"{src_path} has {len(src)} <seg> elements but {tgt_path} has {len(tgt)}: "
                        f"use the source and reference files of the same set")
    for (s_key, _, s_line), (t_key, _, t_line) in zip(src, tgt):
        if s_key != t_key:
            raise UserError(f"{src_path}:{s_line}: <seg> {s_key} faces {t_key} at {tgt_path}:{t_line}: "
                            f"the files are not aligned; use the files of one release")
    return [s for _, s, _ in src], [t for _, t, _ in tgt]


def _find_first(directory, candidates):
    for sub in ("", "de-en", "en-de"):
        for name in candidates:
            path = os.path.join(directory, sub, name)
            if os.path.isfile(path):
                return path
    return None


def corpus_files(hp):
    """{split: (reader, src_path, tgt_path)} for the corpus in hp.data_dir, or a UserError that says
    exactly which files to put where."""
    d, s, t = hp.data_dir, hp.src_lang, hp.tgt_lang
    files, missing = {}, []
    if hp.corpus == "parallel":
        for split, prefix in zip(SPLITS, (hp.train_prefix, hp.dev_prefix, hp.test_prefix)):
            for name in (prefix,) + tuple(p for p in PREFIX_ALTERNATIVES[split] if p != prefix):
                paths = [_find_first(d, [f"{name}.{lang}", f"{name}.{lang}.gz"]) for lang in (s, t)]
                if None not in paths:
                    break
            else:
                paths = [_find_first(d, [f"{prefix}.{lang}", f"{prefix}.{lang}.gz"]) for lang in (s, t)]
            missing += [f"{prefix}.{lang}[.gz]" for lang, p in zip((s, t), paths) if p is None]
            files[split] = (read_parallel, *paths)
    else:
        pairs = (f"{s}-{t}", f"{t}-{s}")
        paths = [_find_first(d, [f"train.tags.{p}.{lang}" for p in pairs]) for lang in (s, t)]
        missing += [f"train.tags.{s}-{t}.{lang}" for lang, p in zip((s, t), paths) if p is None]
        files["train"] = (read_iwslt_train, *paths)
        for split, tst in IWSLT_SETS.items():
            paths = [_find_first(d, [f"IWSLT{y}.TED.{tst}.{p}.{lang}.xml" for y in (16, 17) for p in pairs])
                     for lang in (s, t)]
            missing += [f"IWSLT16.TED.{tst}.{s}-{t}.{lang}.xml" for lang, p in zip((s, t), paths) if p is None]
            files[split] = (read_iwslt_pair, *paths)
    if missing:
        hint = ("run `python prepro.py --preset ... --download` with a network, or copy the release there"
                if hp.data_dir.startswith("data/") else "point --data_dir at the folder that holds them")
        if hp.corpus == "parallel":
            hint += ("; for another language pair name the files train.<lang>, dev.<lang>, test.<lang> "
                     "(e.g. train.en and train.fr) and pass --src_lang and --tgt_lang here, once: "
                     "training, eval and translate read them from --prepro_dir")
        raise UserError(f"{d}: missing corpus files {', '.join(missing)}: {hint}")
    return files


# Downloads

def _fetch(url, path, desc):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".part"
    try:
        with urllib.request.urlopen(url, timeout=60) as r, open(tmp, "wb") as f:
            total = int(r.headers.get("Content-Length") or 0) or None
            with tqdm(total=total, unit="B", unit_scale=True, desc=desc, disable=None) as bar:
                for chunk in iter(lambda: r.read(1 << 20), b""):
                    f.write(chunk)
                    bar.update(len(chunk))
    except OSError as e:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise UserError(f"could not download {url} ({e}); without a network, put the files in "
                        f"{os.path.dirname(path)} by hand (README, 'Recipes', says which files)") from None
    os.replace(tmp, path)


def _check(path, algorithm, expected):
    h = hashlib.new(algorithm)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    if h.hexdigest() != expected:
        os.remove(path)
        raise UserError(f"{path}: {algorithm} {h.hexdigest()} is not the expected {expected}; "
                        f"the download is damaged or the mirror changed: removed it, try again")


def download(hp):
    """Fetch the corpus of hp.corpus into hp.data_dir, checking checksums."""
    if hp.corpus == "parallel":
        for name, digest in MULTI30K_SHA256.items():
            path = os.path.join(hp.data_dir, name)
            if not os.path.isfile(path):
                _fetch(MULTI30K_URL.format(name), path, name)
            _check(path, "sha256", digest)
        return
    archive = os.path.join(hp.data_dir, "2016-01.tgz")
    if not os.path.isfile(archive):
        _fetch(IWSLT2016_URL, archive, "2016-01.tgz")
    _check(archive, "md5", IWSLT2016_MD5)
    with tarfile.open(archive) as outer:
        inner = tarfile.open(fileobj=outer.extractfile(IWSLT2016_INNER))
        inner.extractall(hp.data_dir, filter="data")


# Vocabulary and ids

def train_bpe(sentences, model_prefix, vocab_size, seed):
    """Train a joint sentencepiece BPE model; returns the processor."""
    import sentencepiece as spm

    with tempfile.NamedTemporaryFile("w", encoding="utf-8", suffix=".txt", delete=False) as f:
        f.writelines(s + "\n" for s in sentences if s)
        text_path = f.name
    try:
        spm.set_random_generator_seed(seed)
        spm.SentencePieceTrainer.train(
            input=text_path, model_prefix=model_prefix, vocab_size=vocab_size, model_type="bpe",
            pad_id=0, unk_id=1, bos_id=2, eos_id=3, character_coverage=1.0,
            hard_vocab_limit=False, input_sentence_size=2_000_000, shuffle_input_sentence=True,
            num_threads=os.cpu_count() or 1, minloglevel=2)
    except RuntimeError as e:
        needed = re.search(r"smaller than required_chars\. (\d+) vs (\d+)", str(e))
        if needed:  # more distinct characters than pieces: every character needs a piece of its own
            raise UserError(f"the training text has {needed.group(2)} distinct characters, more than --vocab_size "
                            f"{needed.group(1)} pieces: raise --vocab_size above {needed.group(2)} (for example "
                            f"{max(8000, 2 * int(needed.group(2)))})") from None
        raise UserError(f"sentencepiece could not train on {len(sentences)} sentences ({e}); "
                        f"try a smaller --vocab_size") from None
    finally:
        os.remove(text_path)
    drop_paths(model_prefix + ".model")
    return spm.SentencePieceProcessor(model_file=model_prefix + ".model")


def drop_paths(path):
    """Remove from a sentencepiece model what only describes this run of the trainer (its temporary
    input and output paths, its thread count), so the same corpus and settings give the same bytes,
    and the same checksum in meta.json."""
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto()
    with open(path, "rb") as f:
        proto.ParseFromString(f.read())
    for name in ("input", "model_prefix", "num_threads"):
        proto.trainer_spec.ClearField(name)
    with open(path, "wb") as f:
        f.write(proto.SerializeToString())


def encode(sp, sentences):
    """Ids of each sentence (no <s> or </s>) as one flat int32 array and the lengths."""
    ids = sp.encode(sentences)
    lens = np.fromiter((len(x) for x in ids), dtype=np.int32, count=len(ids))
    flat = np.fromiter((i for x in ids for i in x), dtype=np.int32, count=int(lens.sum()))
    return flat, lens


def sha256_file(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def made_from(hp):
    """The settings that decide what a prepro folder holds."""
    return {f: getattr(hp, f) for f in ("corpus", "data_dir", "src_lang", "tgt_lang", "train_prefix",
                                        "dev_prefix", "test_prefix", "vocab_size", "seed")}


def check_replace(hp, overwrite):
    """A UserError if hp.prepro_dir holds a folder made from other data or settings and overwrite
    is off (building the same again is fine)."""
    path = os.path.join(hp.prepro_dir, "meta.json")
    if overwrite or not os.path.isfile(path):
        return
    with open(path, encoding="utf-8") as f:
        meta = json.load(f)
    then = meta.get("made_from") or {k: meta.get(k) for k in ("corpus", "data_dir", "src_lang", "tgt_lang")}
    now = made_from(hp)
    diff = [f"{k} {then[k]} -> {now[k]}" for k in then if then[k] != now.get(k)]
    if diff:
        raise UserError(f"{hp.prepro_dir} holds a folder made from other data ({', '.join(diff)}); pass "
                        f"--overwrite to replace it (trained runs keep their own copy of its vocabulary) or "
                        f"choose another --prepro_dir")


def prepro(hp, overwrite=False):
    """Read the corpus, train BPE, write ids (replacing a folder made from other data only with
    overwrite). Returns {split: number of pairs}."""
    section("Check the raw files")
    files = corpus_files(hp)
    data = {}
    for split in SPLITS:
        reader, src_path, tgt_path = files[split]
        src, tgt = reader(src_path, tgt_path)
        if split == "train":  # a pair with an empty side teaches nothing
            keep = [i for i, (s, t) in enumerate(zip(src, tgt)) if s and t]
            if len(keep) < len(src):
                print(f"train: dropped {len(src) - len(keep)} pairs with an empty side")
            src, tgt = [src[i] for i in keep], [tgt[i] for i in keep]
        if not src:
            raise UserError(f"{src_path}: no sentences in the {split} split; is the file empty?")
        data[split] = (src, tgt)
        print(f"{split}: {len(src)} pairs from {src_path} and {tgt_path}")
    check_replace(hp, overwrite)

    out_dir = os.path.abspath(hp.prepro_dir)
    parent = os.path.dirname(out_dir)
    os.makedirs(parent, exist_ok=True)
    work = tempfile.mkdtemp(prefix=".tmp-prepro-", dir=parent)
    try:
        section("Train a joint BPE model with sentencepiece")
        train_src, train_tgt = data["train"]
        sp = train_bpe(train_src + train_tgt, os.path.join(work, "bpe"), hp.vocab_size, hp.seed)
        print(f"vocabulary: {sp.get_piece_size()} pieces (asked for {hp.vocab_size})")

        section("Write ids")
        counts = {}
        for split in tqdm(SPLITS, desc="encode", unit="split", disable=None):
            src, tgt = data[split]
            src_ids, src_lens = encode(sp, src)
            tgt_ids, tgt_lens = encode(sp, tgt)
            np.savez(os.path.join(work, f"{split}.npz"), src_ids=src_ids, src_lens=src_lens,
                     tgt_ids=tgt_ids, tgt_lens=tgt_lens)
            for lang, sents in ((hp.src_lang, src), (hp.tgt_lang, tgt)):
                with open(os.path.join(work, f"{split}.{lang}"), "w", encoding="utf-8") as f:
                    f.writelines(s + "\n" for s in sents)
            counts[split] = len(src)
        meta = dict(vocab_size=sp.get_piece_size(), pairs=counts, src_lang=hp.src_lang,
                    tgt_lang=hp.tgt_lang, corpus=hp.corpus, data_dir=hp.data_dir,
                    bpe_sha256=sha256_file(os.path.join(work, "bpe.model")), made_from=made_from(hp))
        with open(os.path.join(work, "meta.json"), "w", encoding="utf-8") as f:
            json.dump(meta, f, indent=2)
        # swap the finished folder in: readers never see a half-written prepro_dir
        old = None
        if os.path.exists(out_dir):
            old = tempfile.mkdtemp(prefix=".old-prepro-", dir=parent)
            os.replace(out_dir, os.path.join(old, "x"))
        os.replace(work, out_dir)
        if old:
            shutil.rmtree(old)
    finally:
        if os.path.exists(work):
            shutil.rmtree(work)
    return counts


def main(argv=None):
    def add_arguments(parser):
        parser.add_argument("--download", action="store_true",
                            help="fetch the corpus into --data_dir first (Multi30k for parallel, "
                                 "IWSLT 2016 for iwslt), checking checksums")
        parser.add_argument("--overwrite", action="store_true",
                            help="replace a --prepro_dir made from other data or settings")
    hp, args, overrides = hyperparams.parse_args(__doc__.split("\n\n")[0], argv, add_arguments, show=SETTINGS)
    if hp.data_dir != hyperparams.preset(args.preset).data_dir and not args.preset_given \
            and "vocab_size" not in overrides and not args.download:
        corpus_files(hp)  # a missing file first
        raise UserError(f"{hp.data_dir}: your own corpus needs a --vocab_size (the sample preset's "
                        f"{hp.vocab_size} pieces suit only its 600 pairs): 8000 for tens of thousands of "
                        f"pairs, 16000-32000 for hundreds of thousands or a script with thousands of characters")
    check_writable(os.path.dirname(os.path.abspath(hp.prepro_dir)))
    if args.download:
        section(f"Download into {hp.data_dir}")
        download(hp)
    counts = prepro(hp, args.overwrite)
    for split, n in counts.items():
        print(f"split {split}: {n} pairs")
    print(f"wrote vocabulary and ids to {hp.prepro_dir}")


if __name__ == "__main__":
    run_cli(main)

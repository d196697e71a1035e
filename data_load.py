"""Read prepro.py's id files into batches: token-budget training batches and ordered eval batches.

Encoder input: source ids + </s>. Decoder input: <s> + target ids. Labels: target ids + </s>.
The batching works on NumPy arrays; `tf_dataset` wraps it in tf.data for TensorFlow, and the same
NumPy batches feed Keras on the JAX backend, where TensorFlow is not installed.
"""
import hashlib
import heapq
import json
import os
import random
import unicodedata

import numpy as np

from support.utils import UserError

PAD, UNK, BOS, EOS = 0, 1, 2, 3
PAD_MULTIPLE = 8  # lengths are padded up to a multiple of this: few distinct batch shapes


# Files

def load_meta(prepro_dir):
    path = os.path.join(prepro_dir, "meta.json")
    if not os.path.isfile(path):
        raise UserError(f"{path}: not found; run `python prepro.py` with the same --preset and "
                        f"--prepro_dir first")
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def load_vocab(prepro_dir):
    """The sentencepiece processor that made the id files of prepro_dir."""
    import sentencepiece as spm

    meta = load_meta(prepro_dir)
    path = os.path.join(prepro_dir, "bpe.model")
    if not os.path.isfile(path):
        raise UserError(f"{path}: the sentencepiece model is missing; restore it or run prepro.py again")
    with open(path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    if digest != meta["bpe_sha256"]:
        raise UserError(f"{path} is not the model that wrote the id files in {prepro_dir} "
                        f"(checksum differs from meta.json); run prepro.py again")
    return spm.SentencePieceProcessor(model_file=path)


def load_split(prepro_dir, split):
    """Ids of one split.

    Returns:
      (src, tgt): lists of int32 arrays, one per sentence, without <s>/</s>.
    """
    path = os.path.join(prepro_dir, f"{split}.npz")
    if not os.path.isfile(path):
        raise UserError(f"{path}: not found; run `python prepro.py` with the same --prepro_dir first")
    with np.load(path) as z:
        src = np.split(z["src_ids"], np.cumsum(z["src_lens"])[:-1])
        tgt = np.split(z["tgt_ids"], np.cumsum(z["tgt_lens"])[:-1])
    vocab_size = load_meta(prepro_dir)["vocab_size"]
    for side, seqs in (("src_ids", src), ("tgt_ids", tgt)):
        top = max((int(s.max()) for s in seqs if len(s)), default=0)
        if top >= vocab_size:
            raise UserError(f"{path}: {side} holds id {top} but the vocabulary has {vocab_size}; "
                            f"the id files and bpe.model do not match: run prepro.py again")
    return src, tgt


def output_ids(output_vocab, tgt):
    """The ids the decoder may output: None for output_vocab "all" (every id); for "target", the
    ids 0-3 and every id that occurs in the training targets tgt (a list of id arrays), ascending.

    A joint vocabulary holds many pieces that only the source side uses; a softmax over the
    target side's pieces alone costs less per step."""
    if output_vocab == "all":
        return None
    seen = np.unique(np.concatenate([np.asarray(t, np.int64).ravel() for t in tgt] + [np.arange(4)]))
    return [int(i) for i in seen]


def pieces_within(sp, texts):
    """The ids of the pieces whose text lies within a word of texts (the word's leading "▁"
    included): every piece a sampled segmentation of texts can hold (subword_sampling: BPE-dropout
    splits a word into pieces of itself, which the deterministic segmentation may never use)."""
    words = {"\u2581" + w for text in texts for w in text.split()}
    longest = max((len(sp.id_to_piece(i)) for i in range(4, sp.get_piece_size())), default=0)
    inside = {w[a:b] for w in words for a in range(len(w)) for b in range(a + 1, min(len(w), a + longest) + 1)}
    return [i for i in range(4, sp.get_piece_size()) if sp.id_to_piece(i) in inside]


class BpeDropout:
    """BPE-dropout (Provilkov et al., 2020) with a sentencepiece BPE model's merges, drawn from a
    seeded generator.

    Sentencepiece's own sampling (encode(enable_sampling=True)) does not repeat across processes
    whatever its seed, so a run with the same --seed would not, nor would a resumed run segment its
    later epochs as the uninterrupted run did. This is sentencepiece's BPE: within each word (a
    piece never spans "▁"), the adjacent pair whose concatenation is a piece with the highest score
    merges first, the leftmost on a tie; with dropout each merge is skipped with probability alpha
    when its turn comes. alpha 0 gives sp.encode's ids (tests/test_data_load.py).
    """

    def __init__(self, sp):
        normal = [i for i in range(sp.get_piece_size())
                  if not (sp.is_control(i) or sp.is_unknown(i) or sp.is_unused(i) or sp.is_byte(i))]
        self.ids = {sp.id_to_piece(i): i for i in normal}
        self.scores = {sp.id_to_piece(i): sp.get_score(i) for i in normal}
        self.unk = sp.unk_id()

    def word(self, word, alpha, rng):
        """The ids of one word (its "▁" first), each merge skipped with probability alpha."""
        symbols = list(word)
        n = len(symbols)
        after, before = list(range(1, n + 1)), list(range(-1, n - 1))  # the neighbours still standing
        agenda = []  # (-score, left, right, length of the merged piece): the best merge first

        def consider(left, right):
            if left >= 0 and right < n and (score := self.scores.get(symbols[left] + symbols[right])) is not None:
                heapq.heappush(agenda, (-score, left, right, len(symbols[left]) + len(symbols[right])))

        for i in range(n - 1):
            consider(i, i + 1)
        while agenda:
            _, left, right, size = heapq.heappop(agenda)
            if not symbols[left] or after[left] != right or len(symbols[left]) + len(symbols[right]) != size:
                continue  # one of the two has merged with another since
            if alpha and rng.random() < alpha:
                continue  # dropped: BPE-dropout
            symbols[left], symbols[right] = symbols[left] + symbols[right], ""
            after[left] = after[right]
            if after[left] < n:
                before[after[left]] = left
            consider(before[left], left)
            consider(left, after[left])
        return [self.ids.get(piece, self.unk) for piece in symbols if piece]

    def encode(self, text, alpha=0.0, rng=None):
        """The ids of a cleaned sentence (clean: single spaces), as sp.encode with alpha 0."""
        return [i for word in text.split() for i in self.word("\u2581" + word, alpha, rng)]


def resegmenter(sp, sources, targets, alpha, seed):
    """For --subword_sampling alpha: a function of the epoch that gives the source and target id
    lists of sources and targets (texts) segmented anew by BPE-dropout (BpeDropout, each merge
    skipped with probability alpha), the same for the same (seed, epoch) in any process."""
    dropout = BpeDropout(sp)

    def resegment(epoch):
        rng = random.Random(seed * 100003 + epoch)
        return tuple([dropout.encode(text, alpha, rng) for text in texts] for texts in (sources, targets))
    return resegment


def load_text(prepro_dir, split, lang):
    """The raw sentences of one side of a split, as prepro.py read them."""
    path = os.path.join(prepro_dir, f"{split}.{lang}")
    if not os.path.isfile(path):
        raise UserError(f"{path}: not found; run `python prepro.py` with the same --prepro_dir first")
    with open(path, encoding="utf-8", newline="\n") as f:  # lines end at \n only, as prepro wrote them
        return [line.rstrip("\n") for line in f]


def clean(text):
    """One sentence as the model and BLEU see it: Unicode NFKC, no byte-order mark or control
    characters, every run of whitespace (tabs, CR, U+2028, ...) one space, no space at the ends."""
    text = unicodedata.normalize("NFKC", text.replace("\ufeff", ""))
    text = "".join(" " if unicodedata.category(c) == "Cc" else c for c in text)
    return " ".join(text.split())


def clean_tensor(sentences):
    """`clean` in TensorFlow ops, for a graph that takes text (trained/serving.py's SavedModel): a string
    tensor -> the same shape, each sentence as `clean` gives it (tests/test_data_load.py checks
    the two agree). Needs tensorflow-text, for NFKC."""
    import tensorflow as tf

    from support.utils import optional
    tf_text = optional("tensorflow_text", "export")
    text = tf_text.normalize_utf8(tf.strings.regex_replace(sentences, "\ufeff", ""), "NFKC")
    return tf.strings.strip(tf.strings.regex_replace(text, r"[\p{Cc}\p{Z}]+", " "))  # Python: isspace


def postprocess(sp, rows):
    """Token ids (N, T) -> text: cut at </s>, drop padding, undo BPE."""
    out = []
    for row in np.asarray(rows):
        row = [int(i) for i in row]
        if EOS in row:
            row = row[:row.index(EOS)]
        out.append(sp.decode([i for i in row if i > EOS]))
    return out


# Batching

def round_up(n, multiple=PAD_MULTIPLE):
    """n rounded up to a multiple of `multiple`."""
    return -(-n // multiple) * multiple


def padded_length(n, multiple=PAD_MULTIPLE, limit=None):
    """The length a batch whose longest row is n is padded to: n rounded up to a multiple of
    `multiple`, but never past limit (maxlen1 or maxlen2: a learned position table has that many
    rows) when n itself fits it. Works on NumPy arrays of lengths too."""
    up = round_up(n, multiple)
    return up if limit is None else np.where(n <= limit, np.minimum(up, limit), up)


def filter_long(src, tgt, maxlen1, maxlen2):
    """Indices of the pairs that fit maxlen1/maxlen2 (counting </s>), and how many were dropped."""
    keep = np.array([i for i, (s, t) in enumerate(zip(src, tgt))
                     if len(s) + 1 <= maxlen1 and len(t) + 1 <= maxlen2], dtype=np.int64)
    return keep, len(src) - len(keep)


def _cut(order, cost, tokens_per_batch, multiple=PAD_MULTIPLE):
    """Cut `order` into consecutive runs whose count x longest padded cost fits the budget."""
    batches, start, longest = [], 0, 0
    for pos, i in enumerate(order):
        longest_with = max(longest, round_up(int(cost[i]), multiple))
        if pos > start and (pos - start + 1) * longest_with > tokens_per_batch:
            batches.append(order[start:pos])
            start, longest_with = pos, round_up(int(cost[i]), multiple)
        longest = longest_with
    if start < len(order):
        batches.append(order[start:])
    return batches


def token_budget_batches(src_lens, tgt_lens, tokens_per_batch, rng=None, multiple=PAD_MULTIPLE, limits=(None, None)):
    """Group sentence indices into batches of similar length under a token budget.

    A batch of n pairs padded to lengths (L1, L2) costs n * max(L1, L2) tokens. Sentences are
    sorted by that cost, then by target and by source length (ties broken at random when rng is
    given), cut into batches greedily, and the batches shuffled. Every index appears exactly once;
    a single over-budget pair forms its own batch.

    The second and third keys leave the batches' cost as it is and cut how much of it is padding:
    pairs of one cost differ in their shorter side. All three are lengths padded up to
    `multiple`, as the batches will be.

    Args:
      src_lens, tgt_lens: (num_pairs,) lengths including </s> (resp. <s>).
      tokens_per_batch: budget.
      rng: numpy Generator for the tie-breaking and batch order; None keeps length order.
      multiple: lengths are padded up to a multiple of this (see `training_arrays`).
      limits: (maxlen1, maxlen2), past which no length is padded (padded_length); None: none.

    Returns:
      list of int64 index arrays.
    """
    src_lens, tgt_lens = np.asarray(src_lens), np.asarray(tgt_lens)
    padded = [padded_length(n, multiple, limit) for n, limit in zip((src_lens, tgt_lens), limits)]
    cost = np.maximum(*padded)
    keys = (*padded, cost)  # lexsort: last key first
    order = np.lexsort(keys if rng is None else (rng.random(len(cost)),) + keys)
    batches = _cut(order, cost, tokens_per_batch, multiple=1)
    if rng is not None:
        rng.shuffle(batches)
    return batches


def length_buckets(src_lens, tgt_lens, count):
    """At most `count` lengths to pad training batches to, for compilers that compile one program per
    batch shape: each pair goes to the shortest bucket that holds its longer side, both sides padded
    to that length, and the buckets are the lengths that make the padded tokens fewest (dynamic
    programming over the longer sides' distinct lengths). Sorted; the last is the longest pair's."""
    longer = np.maximum(src_lens, tgt_lens)
    values, counts = np.unique(longer, return_counts=True)  # (U,) each
    count = min(count, len(values))
    before = np.concatenate([[0], np.cumsum(counts)])  # pairs shorter than values[i]: before[i]
    # best[k][j]: the fewest padded tokens for values[:j+1] in k+1 buckets, the last topped at values[j]
    best = np.full((count, len(values)), np.inf)
    came = np.zeros((count, len(values)), dtype=np.int64)
    best[0] = values * before[1:]
    for k in range(1, count):
        for j in range(k, len(values)):
            costs = best[k - 1][k - 1:j] + values[j] * (before[j + 1] - before[k:j + 1])  # previous top i in k-1..j-1
            came[k][j] = k - 1 + int(np.argmin(costs))
            best[k][j] = costs.min()
    tops, j = [], len(values) - 1
    for k in range(count - 1, -1, -1):
        tops.append(int(values[j]))
        j = came[k][j]
    return np.array(sorted(set(tops)), dtype=np.int64)


def bucket_batches(src_lens, tgt_lens, tokens_per_batch, buckets, rng=None):
    """Batches of one shape a bucket (length_buckets): from the shortest bucket up, the pairs of a
    bucket (their longer side fits its length b and not the one before), in random order when rng
    is given, after those left over by the bucket before, go tokens_per_batch // b to a batch; those
    too few to fill one are left over to the next bucket, padded to its length. Only the last batch
    may be short (TrainBatches.shape fills it out with rows of padding). The batches are shuffled;
    every index appears exactly once."""
    top = np.asarray(buckets)[np.searchsorted(buckets, np.maximum(src_lens, tgt_lens))]  # (num_pairs,)
    batches = [idx for idx, _ in fill_buckets(top, buckets, tokens_per_batch, rng)]
    if rng is not None:
        rng.shuffle(batches)
    return batches


def fill_buckets(bucket_of, buckets, tokens_per_batch, rng=None):
    """bucket_batches' and decode_batches' cut: from the shortest bucket up, the items of a bucket
    b (bucket_of (num_items,) names each one's), in random order when rng is given, after those
    left over by the bucket before, go tokens_per_batch // b to a batch; those too few to fill one
    are left over to the next. Returns [(index array, the bucket it was cut at)], in that order."""
    batches, left = [], np.zeros(0, np.int64)
    for b in buckets:
        idx = np.flatnonzero(bucket_of == b)
        idx = np.concatenate([left, idx if rng is None else rng.permutation(idx)])
        rows = max(1, tokens_per_batch // int(b))
        full = len(idx) // rows * rows
        batches += [(idx[i:i + rows], int(b)) for i in range(0, full, rows)]
        left = idx[full:]
    return batches + ([(left, int(b))] if len(left) else [])


def eval_batches(src_lens, tokens_per_batch, sort=False):
    """Batches for evaluation or translation: every sentence, however long.

    Args:
      src_lens: (num_sents,) source lengths including </s>.
      tokens_per_batch: budget on n * padded source length.
      sort: group by length (less padding); the caller puts the outputs back in order with the
        indices. Without sort, batches are consecutive runs in the original order.

    Returns:
      list of int64 index arrays covering range(num_sents).
    """
    src_lens = np.asarray(src_lens)
    order = np.argsort(src_lens, kind="stable") if sort else np.arange(len(src_lens))
    return _cut(order, src_lens, tokens_per_batch)


def decode_batches(src_lens, tokens_per_batch, limit=None, multiple=PAD_MULTIPLE):
    """Batches for decoding, each but the last in a shape its length alone fixes, not the file:
    the programs compiled for one file (eval.py's dev, say) serve the next from the compile cache
    wherever the shapes meet.

    Each sentence's length is padded up to a multiple of `multiple` (not past limit when it fits:
    padded_length), and the padded lengths are the buckets of fill_buckets (training's cut): from
    the shortest length up, tokens_per_batch // length sentences a batch, those too few to fill one
    left over to the next length, padded to it. So every batch but the last is full, one shape a length
    (a batch of sentences carried over alone is padded to the length it was cut at, as the others).
    Within a length, sentences go to batches shortest first: a batch decodes until its longest
    output ends, and sentences of like length end at like steps.

    Args:
      src_lens: (num_sents,) source lengths including </s>.
      tokens_per_batch: budget on rows * padded source length.
      limit: maxlen1, where learned positions stop.
      multiple: PAD_MULTIPLE, few shapes, for loops compiled for each shape; 1 where any shape
        costs the same (trained.lines.batches): a batch is padded to its own lengths, hardly more.

    Returns:
      list of (int64 index array, the length T1 to pad its sentences to: encoder_inputs' length),
      the index arrays covering range(num_sents).
    """
    src_lens = np.asarray(src_lens, np.int64)  # (num_sents,)
    order = np.argsort(src_lens, kind="stable")  # shortest first: a batch's sentences end near one another
    padded = np.asarray(padded_length(src_lens[order], multiple, limit))  # (num_sents,), in that order
    return [(order[idx], length) for idx, length in fill_buckets(padded, np.unique(padded), tokens_per_batch)]


def loss_batches(src, tgt, tokens_per_batch, maxlen1, maxlen2):
    """The pairs of a split that fit maxlen1/maxlen2 (as training keeps them) in ((x, d), y)
    batches for measuring the loss, grouped by length."""
    keep, _ = filter_long(src, tgt, maxlen1, maxlen2)
    src, tgt = [src[i] for i in keep], [tgt[i] for i in keep]
    lengths = [max(len(s), len(t)) + 1 for s, t in zip(src, tgt)]
    return [training_arrays([src[i] for i in idx], [tgt[i] for i in idx], limits=(maxlen1, maxlen2))
            for idx in eval_batches(lengths, tokens_per_batch, sort=True)]


def pad(seqs, length):
    """Stack int sequences into (N, length), right-padded with <pad>."""
    out = np.full((len(seqs), length), PAD, dtype=np.int32)
    for row, s in zip(out, seqs):
        row[:len(s)] = s
    return out


def encoder_inputs(src_seqs, multiple=PAD_MULTIPLE, limit=None, length=None):
    """Source ids + </s>, padded to a multiple of `multiple` (not past limit: padded_length), or to
    length if given (decode_batches'): (N, T1)."""
    seqs = [np.append(s, EOS) for s in src_seqs]
    return pad(seqs, length or int(padded_length(max(len(s) for s in seqs), multiple, limit)))


def training_arrays(src_seqs, tgt_seqs, multiple=PAD_MULTIPLE, limits=(None, None), shape=None):
    """One batch: ((encoder input (N, T1), decoder input (N, T2)), labels (N, T2)).

    T1 and T2 are the longest lengths rounded up to a multiple of `multiple`: 8 keeps the number
    of distinct shapes small for compilers (XLA, JAX), 1 pads least (TensorFlow graphs take any
    shape without retracing); never past limits, (maxlen1, maxlen2), where the lengths fit them.
    With shape, (N, T1, T2) is that: rows past the pairs are all padding (no token to learn)."""
    if shape is None:
        t1 = int(padded_length(max(len(s) for s in src_seqs) + 1, multiple, limits[0]))
        shape = (len(src_seqs), t1, int(padded_length(max(len(t) for t in tgt_seqs) + 1, multiple, limits[1])))
    rows, t1, t2 = shape
    blank = [np.zeros(0, np.int64)] * (rows - len(src_seqs))  # rows of padding alone: pad() leaves them 0
    x = pad([np.append(s, EOS) for s in src_seqs] + blank, t1)
    decoder_in = pad([np.insert(t, 0, BOS) for t in tgt_seqs] + blank, t2)
    labels = pad([np.append(t, EOS) for t in tgt_seqs] + blank, t2)
    return (x, decoder_in), labels


def sentence_batches(count, batch_sentences, rng):
    """The reference's batches: every sentence once, in random order, batch_sentences at a time
    (the last batch may be smaller); each is padded to its longest sentence."""
    order = rng.permutation(count)
    return [order[i:i + batch_sentences] for i in range(0, count, batch_sentences)]


class TrainBatches:
    """An epoch's training batches as NumPy arrays, reshuffled for every epoch: token-budget
    batches of similar lengths, or with batch_sentences > 0 that many random sentences a batch.

    The batch plan of epoch e depends only on (seed, e), so a resumed run sees the batches the
    uninterrupted run would have seen. With resegment (resegmenter: subword sampling), each epoch's
    pairs are segmented anew, `plan(epoch)` switching to them.
    """

    def __init__(self, src, tgt, tokens_per_batch, seed, maxlen1, maxlen2, multiple=PAD_MULTIPLE,
                 batch_sentences=0, resegment=None, extra_target_ids=(), buckets=0):
        self.maxlen1, self.maxlen2, self.resegment, self.segmented_for = maxlen1, maxlen2, resegment, None
        self.tokens_per_batch, self.seed, self.multiple = tokens_per_batch, seed, multiple
        self.batch_sentences, self.bucket_count, self.buckets = batch_sentences, buckets, None
        # ids a target may hold besides those of the current segmentation: the softmax must cover
        # them too (subword sampling: pieces_within)
        self.extra_target_ids = np.asarray(extra_target_ids, np.int64)
        self.use(src, tgt)

    def use(self, src, tgt):
        """Take these pairs, dropping those longer than maxlen1 / maxlen2."""
        keep, self.dropped = filter_long(src, tgt, self.maxlen1, self.maxlen2)
        if len(keep) == 0:
            raise UserError(f"no training pair fits maxlen1 {self.maxlen1} / maxlen2 {self.maxlen2}: raise them")
        self.src = [src[i] for i in keep]
        self.tgt = [tgt[i] for i in keep]
        self.src_lens = np.array([len(s) + 1 for s in self.src])
        self.tgt_lens = np.array([len(t) + 1 for t in self.tgt])
        if self.bucket_count:  # the lengths batches are padded to: length_buckets of these pairs
            self.buckets = length_buckets(self.src_lens, self.tgt_lens, self.bucket_count)

    def __len__(self):
        return len(self.src)

    def target_ids(self):
        """Every id the decoder must be able to output, as output_ids takes them: the targets' and
        the extra ones."""
        return self.tgt + [self.extra_target_ids]

    def plan(self, epoch):
        """Index batches of `epoch` (0-based), into that epoch's pairs."""
        if self.resegment is not None and self.segmented_for != epoch:
            self.use(*self.resegment(epoch))
            self.segmented_for = epoch
        rng = np.random.default_rng([self.seed, epoch])
        if self.batch_sentences:
            return sentence_batches(len(self.src), self.batch_sentences, rng)
        if self.buckets is not None:
            return bucket_batches(self.src_lens, self.tgt_lens, self.tokens_per_batch, self.buckets, rng)
        return token_budget_batches(self.src_lens, self.tgt_lens, self.tokens_per_batch, rng, self.multiple,
                                    (self.maxlen1, self.maxlen2))

    def batches(self, batch_plan):
        """Yield ((x, decoder_input), labels) NumPy batches of a plan."""
        for idx in batch_plan:
            yield training_arrays([self.src[i] for i in idx], [self.tgt[i] for i in idx],
                                  shape=self.shape(idx))  # every pair fits maxlen1/maxlen2: no row padded past

    def epoch(self, epoch):
        """Yield the NumPy batches of `epoch`."""
        return self.batches(self.plan(epoch))

    def shape(self, idx):
        """(N, T1, T2) of the batch of these pairs: with buckets, the bucket's rows and length (each
        side never past its maxlen), or, for sentence batches, each side's longest padded up to a
        bucket; else the longest lengths padded to a multiple of `multiple`."""
        if self.buckets is not None:
            def up(n, limit):
                return min(int(self.buckets[np.searchsorted(self.buckets, n)]), limit)
            if self.batch_sentences:
                return len(idx), up(self.src_lens[idx].max(), self.maxlen1), up(self.tgt_lens[idx].max(), self.maxlen2)
            b = up(max(self.src_lens[idx].max(), self.tgt_lens[idx].max()), np.inf)
            return max(1, self.tokens_per_batch // b), min(b, self.maxlen1), min(b, self.maxlen2)
        return (len(idx), int(padded_length(int(self.src_lens[idx].max()), self.multiple, self.maxlen1)),
                int(padded_length(int(self.tgt_lens[idx].max()), self.multiple, self.maxlen2)))

    def shapes(self, batch_plan):
        """The distinct (N, T1, T2) of a plan's batches: under XLA or JAX, one compilation each."""
        return {self.shape(idx) for idx in batch_plan}

    def padding(self, batch_plan):
        """The fraction of a plan's batches' tokens (both sides, as padded) that are padding."""
        real = sum(int(self.src_lens[idx].sum() + self.tgt_lens[idx].sum()) for idx in batch_plan)
        return 1 - real / sum(rows * (t1 + t2) for rows, t1, t2 in map(self.shape, batch_plan))

    def target_tokens(self, batch_plan):
        """Real (unpadded) target tokens of each batch in a plan."""
        return [int(self.tgt_lens[idx].sum()) for idx in batch_plan]


def tf_dataset(batch_iterable_fn, num_batches):
    """Wrap a function returning an iterable of num_batches ((x, decoder_input), labels) into tf.data."""
    import tensorflow as tf

    spec = tf.TensorSpec((None, None), tf.int32)
    dataset = tf.data.Dataset.from_generator(batch_iterable_fn, output_signature=((spec, spec), spec))
    dataset = dataset.apply(tf.data.experimental.assert_cardinality(num_batches)).prefetch(2)
    # No autotuning: nothing here is tunable (one generator, a fixed prefetch), and its background
    # thread sleeps 10 ms, 20 ms, 40 ms, ... between rounds, so deleting the iterator at the end of
    # an epoch could wait for its next wake-up, for seconds.
    options = tf.data.Options()
    options.autotune.enabled = False
    return dataset.with_options(options)

"""Write corpora/sample: a small German-English parallel corpus written for this project.

Sentences are built from hand-written phrase pairs (subjects, verb phrases, fronted adverbs,
coordinated subjects) with German agreement and verb-second word order, so that a tiny model can
learn real structure in a few minutes on a CPU. The output is committed; this script documents how
it was made and remakes it byte for byte:

    python corpora/make_sample.py
"""
import os
import random

# (German nominative, English) singular subjects
SUBJECTS = [
    ("der Mann", "the man"), ("die Frau", "the woman"), ("das Kind", "the child"),
    ("der Junge", "the boy"), ("das Mädchen", "the girl"), ("der Hund", "the dog"),
    ("die Katze", "the cat"), ("der Lehrer", "the teacher"), ("die Ärztin", "the doctor"),
    ("mein Bruder", "my brother"), ("meine Schwester", "my sister"), ("ein Mann", "a man"),
    ("eine Frau", "a woman"), ("ein Kind", "a child"), ("ein Junge", "a boy"),
    ("ein Hund", "a dog"), ("der alte Mann", "the old man"), ("die junge Frau", "the young woman"),
    ("das kleine Kind", "the small child"), ("der große Hund", "the big dog"),
    ("die schwarze Katze", "the black cat"),
]
# plural subjects
PLURALS = [
    ("die Kinder", "the children"), ("zwei Männer", "two men"), ("die Frauen", "the women"),
    ("drei Hunde", "three dogs"), ("meine Eltern", "my parents"),
]
# (German singular, German plural, English singular, English plural) verb phrases
VERB_PHRASES = [
    ("liest ein Buch", "lesen ein Buch", "reads a book", "read a book"),
    ("liest die Zeitung", "lesen die Zeitung", "reads the newspaper", "read the newspaper"),
    ("isst einen Apfel", "essen einen Apfel", "eats an apple", "eat an apple"),
    ("isst das Brot", "essen das Brot", "eats the bread", "eat the bread"),
    ("trinkt Wasser", "trinken Wasser", "drinks water", "drink water"),
    ("trinkt Kaffee", "trinken Kaffee", "drinks coffee", "drink coffee"),
    ("sieht den Hund", "sehen den Hund", "sees the dog", "see the dog"),
    ("sieht die Katze", "sehen die Katze", "sees the cat", "see the cat"),
    ("kauft ein Auto", "kaufen ein Auto", "buys a car", "buy a car"),
    ("kauft Blumen", "kaufen Blumen", "buys flowers", "buy flowers"),
    ("spielt im Park", "spielen im Park", "plays in the park", "play in the park"),
    ("spielt Fußball", "spielen Fußball", "plays soccer", "play soccer"),
    ("schläft im Garten", "schlafen im Garten", "sleeps in the garden", "sleep in the garden"),
    ("läuft am Strand", "laufen am Strand", "runs on the beach", "run on the beach"),
    ("wartet am Bahnhof", "warten am Bahnhof", "waits at the station", "wait at the station"),
    ("sitzt auf einer Bank", "sitzen auf einer Bank", "sits on a bench", "sit on a bench"),
    ("fährt Fahrrad", "fahren Fahrrad", "rides a bike", "ride a bike"),
    ("arbeitet in der Küche", "arbeiten in der Küche", "works in the kitchen", "work in the kitchen"),
    ("schwimmt im See", "schwimmen im See", "swims in the lake", "swim in the lake"),
    ("singt ein Lied", "singen ein Lied", "sings a song", "sing a song"),
    ("öffnet das Fenster", "öffnen das Fenster", "opens the window", "open the window"),
    ("schreibt einen Brief", "schreiben einen Brief", "writes a letter", "write a letter"),
    ("trägt einen roten Hut", "tragen einen roten Hut", "wears a red hat", "wear a red hat"),
    ("steht vor dem Haus", "stehen vor dem Haus", "stands in front of the house",
     "stand in front of the house"),
]
# fronted adverbs: German puts the verb second, before the subject
ADVERBS = [("heute", "today"), ("morgens", "in the morning"), ("am Abend", "in the evening"),
           ("jetzt", "now")]

SPLITS = (("train", 500), ("dev", 50), ("test", 50))


def capitalize(text):
    return text[0].upper() + text[1:]


def make_pair(rng):
    """One (German, English) sentence pair."""
    vp_de_sg, vp_de_pl, vp_en_sg, vp_en_pl = rng.choice(VERB_PHRASES)
    kind = rng.random()
    if kind < 0.2:  # two coordinated subjects take the plural verb
        (s1_de, s1_en), (s2_de, s2_en) = rng.sample(SUBJECTS, 2)
        subj_de, subj_en, vp_de, vp_en = f"{s1_de} und {s2_de}", f"{s1_en} and {s2_en}", vp_de_pl, vp_en_pl
    elif kind < 0.35:
        subj_de, subj_en = rng.choice(PLURALS)
        vp_de, vp_en = vp_de_pl, vp_en_pl
    else:
        subj_de, subj_en = rng.choice(SUBJECTS)
        vp_de, vp_en = vp_de_sg, vp_en_sg
    if rng.random() < 0.3:
        adv_de, adv_en = rng.choice(ADVERBS)
        verb, _, rest = vp_de.partition(" ")
        de = f"{adv_de} {verb} {subj_de} {rest}"
        en = f"{adv_en} {subj_en} {vp_en}"
    else:
        de, en = f"{subj_de} {vp_de}", f"{subj_en} {vp_en}"
    return capitalize(de) + ".", capitalize(en) + "."


def main():
    rng = random.Random(2016)
    pairs, seen = [], set()
    total = sum(n for _, n in SPLITS)
    while len(pairs) < total:
        pair = make_pair(rng)
        if pair[0] not in seen:
            seen.add(pair[0])
            pairs.append(pair)
    here = os.path.dirname(os.path.abspath(__file__))
    start = 0
    for split, n in SPLITS:
        chunk = pairs[start:start + n]
        start += n
        for lang, side in (("de", 0), ("en", 1)):
            with open(os.path.join(here, "sample", f"{split}.{lang}"), "w", encoding="utf-8") as f:
                f.writelines(p[side] + "\n" for p in chunk)
        print(f"split {split}: {len(chunk)} pairs")


if __name__ == "__main__":
    main()

"""The documents' tables of measured figures, drawn from the records in docs/records/.

    python bench/tables.py                     # redraw every table in README.md, README.zh.md, docs/*.md
    python bench/tables.py --check             # exit status 1 where a document's table is not its records'
    python bench/tables.py add log/sample/results/test_E10L2.50B20.00.json   # keep a record, then redraw

A record (support/records.py) is what a script measured, with its date, commit, machine and command:
eval.py writes one beside its results, bench/translate_speed.py with --record PATH. A document holds
a table between two lines that name it,

    <!-- table results (drawn by bench/tables.py from docs/records/: do not edit) -->
    ...
    <!-- end table results -->

and this script writes what is between them; a table the script does not know stops it.
"""
import argparse
import os
import re
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from support import records  # noqa: E402
from support.utils import UserError, run_cli  # noqa: E402

ROOT = records.ROOT
RECORDS = os.path.join(ROOT, "docs", "records")
DOCUMENTS = ("README.md", "README.zh.md", "docs/results.md", "docs/speed.md")
BLOCK = re.compile(r"(<!-- table (\w+) \(drawn by bench/tables.py from docs/records/: do not edit\) -->\n)(.*?)"
                   r"(<!-- end table \2 -->)", re.S)

WORDS = {  # the tables' words, for the English and the Chinese documents
    "en": dict(cpu="CPU (2 cores)", bf16="bfloat16 / AMX", trained="trained in", epochs="epochs",
               minutes="training (min)", decoding="decoding", sacrebleu="test sacreBLEU", ref="test ref. way",
               preset="preset", split="split", date="date", commit="commit", command="command", yes="yes", no="no",
               memory="peak memory (MB)", greedy="greedy", beam="beam {k}", search="search",
               ours_first="ours, first pass (s)", ours_again="ours, again (s)", ct2_first="CTranslate2, first (s)",
               repeats="second passes each (median)", ct2_again="CTranslate2, again (s)",
               ratio_first="first: ours / CT2",
               ratio_again="again: ours / CT2", alike="lines alike", of="of", record="record",
               cache="first pass's compile cache", cache_empty="empty", cache_run="the run's",
               batches="batches", shapes="shapes", padding="source padding",
               row_steps="rows x steps per token written", shape="shape (rows x source length)",
               excess="first pass's excess (s)", loops="decoding loops", loops_xla="XLA, each shape",
               loops_graph="one graph",
               group="group (`bash setup.sh GROUP`)", download="download (MB)", installed="installed, with .venv (MB)",
               run="run", to_bleu="minutes to dev BLEU", not_reached="not reached",
               last_bleu="last epoch's dev BLEU (greedy)", eval_dev="eval.py on dev (checkpoint, decoding, BLEU)",
               settings="settings", seeds="seeds", ratio="time ÷ preset's", dev_beam="dev BLEU beam (mean ± sd)",
               difference="difference", verdict="verdict", as_above="as above"),
    "zh": dict(cpu="CPU（2 核）", bf16="bfloat16 / AMX", trained="训练精度", epochs="轮数",
               minutes="训练（分钟）", decoding="解码", sacrebleu="测试 sacreBLEU", ref="测试（参考实现的算法）",
               preset="预设", split="数据", date="日期", commit="提交", command="命令", yes="有", no="无",
               memory="内存峰值（MB）", greedy="贪心", beam="束 {k}", search="搜索",
               ours_first="本项目，首次（秒）", ours_again="本项目，再次（秒）", ct2_first="CTranslate2，首次（秒）",
               repeats="各自的再次次数（取中位数）", ct2_again="CTranslate2，再次（秒）",
               ratio_first="首次：本项目 / CT2",
               ratio_again="再次：本项目 / CT2", alike="译文相同的行", of="/", record="记录",
               cache="首次的编译缓存", cache_empty="空", cache_run="该次训练的",
               batches="批数", shapes="形状数", padding="源端填充", row_steps="每个输出词元的行 × 步数",
               shape="形状（行 × 源端长度）", excess="首次多用（秒）", loops="解码循环", loops_xla="XLA，每个形状",
               loops_graph="一个图",
               group="依赖组（`bash setup.sh GROUP`）", download="下载（MB）", installed="安装后，含 .venv（MB）",
               run="运行", to_bleu="达到开发集 BLEU 的分钟数", not_reached="未达到",
               last_bleu="最后一轮的开发集 BLEU（贪心）", eval_dev="eval.py 开发集结果（检查点、解码、BLEU）",
               settings="设置", seeds="种子数", ratio="时间 ÷ 预设的", dev_beam="开发集 BLEU，束搜索（均值 ± 标准差）",
               difference="差", verdict="结论", as_above="同上"),
}


def table(header, rows):
    return "\n".join(["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
                      *("| " + " | ".join(str(cell) for cell in row) + " |" for row in rows)]) + "\n"


def flags(record, w):
    machine = record["machine"]
    return f"{w['yes'] if machine['bfloat16'] else w['no']} / {w['yes'] if machine['amx'] else w['no']}"


def decoding(figures, w):
    return w["greedy"] if figures["beam_size"] == 1 else w["beam"].format(k=figures["beam_size"])


def loops(figures, w):
    """How a translate_speed record's decoding loops ran (records from before the choice: XLA)."""
    return w[f"loops_{figures.get('loops', 'xla')}"]


def run_name(record):
    """The preset a run was evaluated as (eval.py's --preset), or where --logdir alone was given, its folder."""
    return record["figures"].get("preset") or record["figures"].get("logdir", "–")


def bleu_records(all_records, preset=None, split="test", leave_out=()):
    chosen = [r for r in all_records if r["kind"] == "bleu" and r["figures"]["split"] == split
              and (preset is None or r["figures"].get("preset") == preset) and run_name(r) not in leave_out]
    return sorted(chosen, key=lambda r: (run_name(r), r["machine"]["class"],
                                         r["figures"].get("train_precision") or "", r["figures"]["beam_size"]))


def results(all_records, w, full=False):
    """Test BLEU of every preset's run recorded (but the quick start's, in the README: its own table
    there), a row per run and decoding."""
    header = [w["preset"], w["cpu"], w["bf16"], w["trained"], w["epochs"], w["minutes"], w["decoding"],
              w["sacrebleu"], w["ref"]] + ([w["memory"], w["date"], w["commit"], w["command"], w["record"]]
                                           if full else [])
    rows = []
    for r in bleu_records(all_records, leave_out=() if full else ("sample",)):
        f = r["figures"]
        row = [run_name(r), r["machine"]["class"], flags(r, w), f.get("train_precision", "–"), f.get("epochs", "–"),
               f"{f['train_minutes']:.1f}" if f.get("train_minutes") is not None else "–", decoding(f, w),
               f"{f['sacrebleu']:.2f}", f"{f['reference_bleu']:.2f}"]
        if full:
            memory = f.get("train_peak_memory_mb")
            row += [f"{memory:,.0f}" if memory else "–", r["date"], r["commit"], f"`{r['command']}`",
                    f"[{w['record']}](records/{r['file']})"]
        rows.append(row)
    return table(header, rows)


def memory(all_records, w):
    """train.py's peak memory: for each preset, CPU class and precision, the newest run whose record has it."""
    newest = {}
    for r in sorted((r for r in all_records if r["kind"] == "bleu" and r["figures"].get("train_peak_memory_mb")),
                    key=lambda r: r["date"]):
        precision = r["figures"].get("train_precision", "–")
        newest[run_name(r), r["machine"]["class"], precision] = [
            run_name(r), r["machine"]["class"], precision, r["figures"].get("epochs", "–"),
            f"{r['figures']['train_peak_memory_mb']:,.0f}", r["date"], r["commit"]]
    return table([w["preset"], w["cpu"], w["trained"], w["epochs"], w["memory"], w["date"], w["commit"]],
                 sorted(map(tuple, newest.values())))


def quickstart(all_records, w):
    """What the quick start prints at its end, on each CPU class and precision recorded."""
    rows = [[r["machine"]["class"], flags(r, w), r["figures"].get("train_precision", "–"),
             f"{r['figures']['train_minutes'] * 60:.0f}", f"{r['figures']['sacrebleu']:.2f}",
             f"{r['figures']['reference_bleu']:.2f}"]
            for r in bleu_records(all_records, "sample") if r["figures"]["beam_size"] == 1]
    seconds = "training (s)" if w is WORDS["en"] else "训练（秒）"
    return table([w["cpu"], w["bf16"], w["trained"], seconds, w["sacrebleu"], w["ref"]], rows)


def translate_speed(all_records, w):
    """bench/translate_speed.py's rows: the port's first and second pass beside CTranslate2's."""
    rows = []
    for r in (r for r in all_records if r["kind"] == "translate_speed"):
        f = r["figures"]
        for s in f["searches"]:
            name = decoding(s, w)
            rows.append([name, r["machine"]["class"], flags(r, w), r["precision"], f["lines"], f["beam_stop"],
                         loops(f, w), w[f"cache_{f.get('cache', 'empty')}"], f"{s['ours_first_s']:.2f}",
                         f.get("repeats", 1), f"{s['ours_again_s']:.2f}",
                         f"{s['ct2_first_s']:.2f}",
                         f"{s['ct2_again_s']:.2f}", f"{s['ours_first_s'] / s['ct2_first_s']:.2f}",
                         f"{s['ours_again_s'] / s['ct2_again_s']:.2f}", f"{s['lines_alike']} {w['of']} {f['lines']}",
                         r["date"], r["commit"], f"[{w['record']}](records/{r['file']})"])
    return table([w["search"], w["cpu"], w["bf16"], "precision", "lines", "--beam_stop", w["loops"], w["cache"],
                  w["ours_first"], w["repeats"],
                  w["ours_again"], w["ct2_first"], w["ct2_again"], w["ratio_first"], w["ratio_again"], w["alike"],
                  w["date"], w["commit"], w["record"]], rows)


def translate_batches(all_records, w):
    """bench/translate_speed.py's batching of each search: batches, shapes, padding, rows x steps."""
    rows = []
    for r in (r for r in all_records if r["kind"] == "translate_speed"):
        for s in (s for s in r["figures"]["searches"] if "batches" in s):
            name = decoding(s, w)
            steps = s.get("row_steps_per_token")
            rows.append([name, r["machine"]["class"], r["figures"]["lines"], s["batches"], s["shapes"],
                         f"{s['padding']:.0%}", "" if steps is None else f"{steps:.2f}", r["date"], r["commit"],
                         f"[{w['record']}](records/{r['file']})"])
    return table([w["search"], w["cpu"], "lines", w["batches"], w["shapes"], w["padding"], w["row_steps"], w["date"],
                  w["commit"], w["record"]], rows)


def translate_shapes(all_records, w):
    """bench/translate_speed.py's seconds per batch shape in each pass, and the first pass's excess."""
    rows = []
    for r in (r for r in all_records if r["kind"] == "translate_speed"):
        f = r["figures"]
        for s in (s for s in f["searches"] if "shapes_timed" in s):
            name = decoding(s, w)
            cache = w[f"cache_{f.get('cache', 'empty')}"]
            rows += [[name, r["machine"]["class"], loops(f, w), cache, f"{t['rows']} x {t['length']}", t["batches"],
                      f"{t['first_s']:.2f}", f"{t['again_s']:.2f}", f"{t['first_s'] - t['again_s']:.2f}",
                      r["date"], r["commit"], f"[{w['record']}](records/{r['file']})"] for t in s["shapes_timed"]]
    return table([w["search"], w["cpu"], w["loops"], w["cache"], w["shape"], w["batches"], w["ours_first"],
                  w["ours_again"],
                  w["excess"], w["date"], w["commit"], w["record"]], rows)


def footprint(all_records, w):
    """bench/footprint.py's rows: what each requirement group downloads and takes on disk."""
    rows = [[f"`{g['group']}`", f"{g['download_mb']:,}", f"{g['installed_mb']:,}", r["figures"]["python"], r["date"]]
            for r in all_records if r["kind"] == "footprint" for g in r["figures"]["groups"]]
    return table([w["group"], w["download"], w["installed"], "Python", w["date"]], rows)


def command_and_record(r, w, k):
    """The last two cells of a record's k-th row: its command (the first row only; "as above"
    after it) and the link to the record."""
    return [w["as_above"] if k else f"`{r['command']}`", f"[{w['record']}](records/{r['file']})"]


def time_to_quality(all_records, w):
    """bench/time_to_quality.py's runs side by side: minutes to each dev BLEU and the final figures."""
    rows = []
    for r in (r for r in all_records if r["kind"] == "time_to_quality"):
        for k, run in enumerate(r["figures"]["runs"]):
            reached = " · ".join(f"{t}: {w['not_reached'] if m is None else f'{m:.1f}'}"
                                 for t, m in run["minutes_to"].items())
            rows.append([run["label"], r["machine"]["class"], flags(r, w), run["precision"], run["epochs"],
                         f"{run['minutes']:.1f}", reached, f"{run['last_dev_bleu']:.2f}", run["eval_dev"] or "–",
                         r["date"], r["commit"], *command_and_record(r, w, k)])
    return table([w["run"], w["cpu"], w["bf16"], w["trained"], w["epochs"], w["minutes"], w["to_bleu"],
                  w["last_bleu"], w["eval_dev"], w["date"], w["commit"], w["command"], w["record"]], rows)


def recipes(all_records, w):
    """ablate.py --table recipes' rows (its --record): each recipe's minutes, its share of the
    preset's, its dev beam BLEU over the seeds and the verdict by ablate.TARGET."""
    rows = []
    for r in (r for r in all_records if r["kind"] == "recipes"):
        for k, row in enumerate(r["figures"]["rows"]):
            rows.append([row["name"], f"`{row['settings']}`" if row["settings"] else "–", r["machine"]["class"],
                         flags(r, w), ", ".join(row["precision"]), row["seeds"],
                         "–" if row["minutes"] is None else f"{row['minutes']:.1f}",
                         "–" if row["ratio"] is None else f"{row['ratio']:.2f}",
                         f"{row['beam']:.2f} ± {row['sd']:.2f}", f"{row['difference']:+.2f}", row["verdict"],
                         ", ".join(row["date"]), ", ".join(row["commit"]), *command_and_record(r, w, k)])
    return table([w["run"], w["settings"], w["cpu"], w["bf16"], w["trained"], w["seeds"], w["minutes"], w["ratio"],
                  w["dev_beam"], w["difference"], w["verdict"], w["date"], w["commit"], w["command"], w["record"]],
                 rows)


TABLES = {"quickstart": quickstart, "footprint": footprint, "memory": memory, "results": results,
          "results_full": lambda rs, w: results(rs, w, full=True), "translate_speed": translate_speed,
          "translate_batches": translate_batches, "translate_shapes": translate_shapes,
          "time_to_quality": time_to_quality, "recipes": recipes}


# Numbers in the documents that are not measured here, each with what it is
NOT_MEASURED = {"3.11": "Python's version", "2.21": "TensorFlow's version", "3.15": "Keras' version",
                "2.0": "the license's version", "1.4": "the preset's length penalty alpha, a setting",
                "28.06": "the reference's published BLEU on tst2013 (its README)",
                "23.88": "the reference's published BLEU on tst2014 (its README)",
                **{n: "a section of the paper" for n in ("3.1", "3.3", "3.4", "3.5", "5.1", "5.2", "5.3", "5.4",
                                                         "6.1")}}
# Documents whose figures are drawn from records by other scripts: ablate.py draws docs/ablations.md's
# table from docs/ablations.json, reference.py curves its curves from docs/reference_curves/ (tests check both)
DRAWN_ELSEWHERE = ("docs/ablations.md",)
FIGURE = re.compile(r"(?<![\w.])[-−+]?(\d[\d,]*\.\d+|\d[\d,]*(?= ?(?:(?:s|min|minutes|MB|GB)\b|%|秒|分钟)))(?![\w.])")


def figures_of(text):
    """The measured-looking figures of a text outside its drawn tables: decimals, and numbers with a
    unit of time, size or share."""
    return {m.group(1) for m in FIGURE.finditer(BLOCK.sub("", text))}


def recorded_figures(all_records, root=ROOT):
    """Every way the records' figures may be written, and the figures of the documents drawn elsewhere."""
    found = set()

    def walk(value):
        if isinstance(value, dict):
            for v in value.values():
                walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            found.update({f"{value:.2f}", f"{value:.1f}", f"{value:.0f}", f"{value:,.0f}", str(value)})
    for r in all_records:
        walk(r["figures"])
    for document in DRAWN_ELSEWHERE:
        with open(os.path.join(root, document), encoding="utf-8") as f:
            found |= {m.group(1) for m in FIGURE.finditer(f.read())}
    return found


def unrecorded(text, all_records, root=ROOT):
    """The figures of a document that no record has (nor NOT_MEASURED names)."""
    return sorted(figures_of(text) - recorded_figures(all_records, root) - set(NOT_MEASURED))


def draw(text, all_records, lang):
    """The document's text with each table drawn anew from the records."""
    def replace(match):
        opening, name, _, closing = match.groups()
        if name not in TABLES:
            raise UserError(f"a table named {name!r}: bench/tables.py draws {', '.join(TABLES)}")
        return opening + TABLES[name](all_records, WORDS[lang]) + closing
    return BLOCK.sub(replace, text)


def drawn(root=ROOT, folder=RECORDS):
    """{document: (its text, its text with the tables drawn from the records)}."""
    all_records = records.read_folder(folder)
    out = {}
    for document in DOCUMENTS:
        path = os.path.join(root, document)
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                text = f.read()
            out[document] = text, draw(text, all_records, "zh" if ".zh." in document else "en")
    return out


def add(paths):
    """Copy records into docs/records/, named by date, kind and their source."""
    for path in paths:
        record = records.read(path)
        source = os.path.splitext(os.path.basename(path))[0]
        folder = os.path.dirname(os.path.abspath(path))
        if os.path.basename(folder) == "results":  # eval.py's: <logdir>/results/<split>_<checkpoint>.json
            source = f"{os.path.basename(os.path.dirname(folder))}-{source}"
        name = f"{record['date']}-{record['kind']}-{source}.json"
        shutil.copyfile(path, os.path.join(RECORDS, name))
        print(f"kept {path} as docs/records/{name}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog="add FILE...: keep records first")
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 where a table differs from its records")
    p.add_argument("add", nargs="*", metavar="add FILE", help="'add' then record files to keep in docs/records/")
    args = p.parse_args(argv)
    if args.add:
        if args.add[0] != "add" or len(args.add) < 2:
            p.error("give 'add' then one or more record files")
        add(args.add[1:])
    stale, all_records = [], records.read_folder(RECORDS)
    for document, (text, new) in drawn().items():
        missing = unrecorded(new, all_records)
        if missing:
            print(f"{document}: figures no record has: {', '.join(missing)} (draw them in a table from a record, "
                  "or take them out)")
        if new != text:
            stale.append(document)
            if not args.check:
                with open(os.path.join(ROOT, document), "w", encoding="utf-8") as f:
                    f.write(new)
        stale += [document] if missing and args.check else []
    if args.check:
        print("tables differ from their records, or figures have none, in: " + ", ".join(sorted(set(stale)))
              if stale else "every table is its records', and every figure has one")
        return 1 if stale else 0
    print(f"redrew the tables of {', '.join(stale)}" if stale else "every table was already its records'")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))

"""page.py, the page that looks inside a trained run: it serves on 127.0.0.1, answers as translate.py
translates (dozens of requests at once, each its own), answers bad input in one line and goes on
serving, refuses a run it cannot load before it starts, and works in a real browser (headless
Chromium from the system's packages, driven by Selenium), which also takes the README's picture.
"""
import concurrent.futures
import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from conftest import GERMAN, ROOT, assert_one_line_error, run_script

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
# Where the browser test writes its screenshot (the README's docs/img/page.png is one): set
# PAGE_SCREENSHOT to keep it
SCREENSHOT = os.environ.get("PAGE_SCREENSHOT")
BEAM, ALPHA = 4, 0.6
LONG = " ".join(["Ein Mann fährt Fahrrad und die Frau läuft mit einem Hund im Park."] * 8)


def sample_lines(name, count):
    with open(os.path.join(ROOT, "corpora", "sample", name), encoding="utf-8") as f:
        return [line.strip() for line in f][:count]


SENTENCES = sample_lines("test.de", 24) + sample_lines("dev.de", 12)  # 36, each sent at once


@contextlib.contextmanager
def serving(quick_start, *args):
    """page.py serving the quick start's model on a free port, started as after `bash demo.sh` (in
    the folder the quick start ran in, with --preset sample): its address."""
    process = subprocess.Popen([sys.executable, os.path.join(ROOT, "page.py"), "--preset", "sample", "--port", "0",
                                *args], cwd=quick_start.root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline()  # the address, once the model is loaded and the port bound
        found = re.search(r"at (http://127\.0\.0\.1:\d+/)", line)
        if not found:
            process.kill()
            pytest.fail(f"page.py printed no address: {line!r}\n{process.stderr.read()[-3000:]}")
        yield found.group(1)
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.fixture(scope="module")
def page(quick_start):
    with serving(quick_start) as address:
        yield address


@pytest.fixture(scope="module")
def translated(quick_start, tmp_path_factory):
    """translate.py's translations of SENTENCES, GERMAN[0] and LONG at BEAM and ALPHA, by line."""
    lines = [*SENTENCES, GERMAN[0], LONG]
    source = tmp_path_factory.mktemp("page") / "in.de"
    source.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    run = run_script("translate.py", *quick_start.dirs, "--beam_size", str(BEAM), "--alpha", str(ALPHA),
                     "--input", str(source))
    assert run.returncode == 0, run.stderr[-3000:]
    return dict(zip(lines, run.stdout.split("\n")))


def ask(address, body, timeout=300):
    """(status, JSON answer) of POST /api/translate with body (a dict, or bytes sent as they are)."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(address + "api/translate", data=data,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


@pytest.mark.slow
def test_dozens_of_requests_at_once_each_get_translate_pys_translation(page, translated):
    with concurrent.futures.ThreadPoolExecutor(len(SENTENCES)) as pool:
        answers = list(pool.map(lambda s: ask(page, dict(text=s, beam_size=BEAM, alpha=ALPHA)), SENTENCES))
    for sentence, (status, answer) in zip(SENTENCES, answers):
        assert status == 200, answer
        run = answer["runs"][0]
        assert run["translation"] == translated[sentence], sentence
        assert run["hypotheses"][0]["returned"] and len(run["hypotheses"]) <= BEAM
        cross = [m for m in run["maps"] if m["kind"] == "cross"]
        assert cross and all(len(m["rows"]) == len(run["output"]) and m["columns"] == run["source"] for m in cross)
        for m in run["maps"]:  # each head's rows, and their mean's, sum to 1
            assert all(abs(sum(row) - 1) < 1e-2 for head in m["heads"] for row in head), m["name"]


@pytest.mark.slow
def test_bad_input_gets_one_line_and_the_server_keeps_serving(page, translated):
    bad = [(dict(text=""), "nothing to translate"),
           (dict(text="   \n "), "nothing to translate"),
           (dict(text="a" * 6000), "more than the 5000 the page takes"),
           (dict(text=GERMAN[0], beam_size=0), "beam size must be from 1 to 16"),
           (dict(text=GERMAN[0], beam_size="four"), "must be a whole number"),
           (dict(text=GERMAN[0], alpha=-1), "length penalty alpha must be from 0 to 5"),
           (b"not json", "send JSON")]
    for body, message in bad:
        status, answer = ask(page, body)
        assert status == 400 and message in answer["error"] and "\n" not in answer["error"], (body, answer)
        status, answer = ask(page, dict(text=GERMAN[0], beam_size=BEAM, alpha=ALPHA))  # still serving
        assert status == 200 and answer["runs"][0]["translation"] == translated[GERMAN[0]]
    status, answer = ask(page, dict(text="Ein Mann fährt Fahrrad ж.", beam_size=BEAM))  # translated, with a note
    assert status == 200 and "no piece for ж" in answer["runs"][0]["notes"][0], answer["runs"][0]["notes"]
    status, answer = ask(page, dict(text=LONG, beam_size=BEAM, alpha=ALPHA))  # cut as translate.py cuts it
    run = answer["runs"][0]
    assert status == 200 and run["translation"] == translated[LONG]
    assert any(re.search(r"translated in \d+ parts, as translate.py does", note) for note in run["notes"]), run["notes"]
    with urllib.request.urlopen(page + "api/runs", timeout=60) as response:
        assert json.load(response)["runs"][0]["beam_size"] >= 1


@pytest.mark.slow
def test_two_runs_side_by_side(quick_start, tmp_path, translated):
    other = tmp_path / "other"
    shutil.copytree(quick_start.log, other)
    with serving(quick_start, "--compare", str(other)) as address:
        status, answer = ask(address, dict(text=GERMAN[0], beam_size=BEAM, alpha=ALPHA))
    assert status == 200 and [run["name"] for run in answer["runs"]] == ["log/sample", str(other)]
    assert [run["translation"] for run in answer["runs"]] == [translated[GERMAN[0]]] * 2


def test_page_refuses_a_run_it_cannot_load_before_serving(quick_start, tmp_path):
    empty = tmp_path / "log"
    shutil.copytree(quick_start.log, empty, ignore=shutil.ignore_patterns("ckpt"))
    run = run_script("page.py", "--prepro_dir", str(quick_start.prepro), "--logdir", str(empty), "--port", "0")
    assert_one_line_error(run, rf"{re.escape(str(empty / 'ckpt'))}: no checkpoint; train first")
    run = run_script("page.py", *quick_start.dirs, "--compare", str(tmp_path), "--port", "0")
    assert_one_line_error(run, rf"{re.escape(str(tmp_path))}: not a training run \(no hparams.json\)")


def test_page_without_its_group_says_how_to_add_it(quick_start):
    run = run_script(os.path.join("tests", "without.py"), "flask,werkzeug", "page.py", *quick_start.dirs)
    assert_one_line_error(run, r"flask is not installed .*`bash setup.sh page`")


def chromium():
    """A headless Chromium under Selenium, or a skip where the system has none (a failure in CI,
    whose .ci/run installs it)."""
    if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
        message = f"no {CHROMIUM} and {CHROMEDRIVER}: apt-get install chromium chromium-driver"
        if os.environ.get("CI"):
            pytest.fail(message + " (.ci/run installs them)")
        pytest.skip(message)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--window-size=1500,1500"):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


@pytest.mark.slow
def test_the_page_in_a_real_browser(page, translated, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    browser = chromium()
    try:
        wait = WebDriverWait(browser, 300)
        browser.get(page)
        wait.until(lambda b: b.find_element(By.TAG_NAME, "body").get_attribute("data-ready") == "yes")
        assert browser.execute_script("return location.hostname") == "127.0.0.1"

        def submit(text):
            box = browser.find_element(By.ID, "text")
            box.clear()
            box.send_keys(text)
            for name, value in (("beam_size", BEAM), ("alpha", ALPHA)):
                field = browser.find_element(By.ID, name)
                field.clear()
                field.send_keys(str(value))
            browser.find_element(By.ID, "translate").click()
            wait.until(lambda b: b.find_element(By.ID, "busy").get_attribute("hidden") is not None
                       and (b.find_elements(By.CSS_SELECTOR, ".translation")
                            or b.find_element(By.ID, "message").is_displayed()))

        submit(GERMAN[0])
        shown = browser.find_element(By.CSS_SELECTOR, ".run .translation").text
        assert shown == translated[GERMAN[0]]
        rows = browser.find_elements(By.CSS_SELECTOR, "table.heatmap tbody tr")
        pieces = [row.find_element(By.TAG_NAME, "th").text for row in rows]
        assert pieces[-1] == "</s>"  # one row per output piece, which spell the translation
        assert "".join(pieces[:-1]).replace("\u2581", " ").strip() == shown
        rows[1].click()  # a row lights up the source pieces it attends to
        strip = browser.find_elements(By.CSS_SELECTOR, ".strip span")
        assert len(strip) == len(browser.find_elements(By.CSS_SELECTOR, "table.heatmap thead th")) - 1
        assert "lit" in rows[1].get_attribute("class")
        assert browser.find_element(By.CSS_SELECTOR, "tr.returned").is_displayed()
        assert browser.execute_script("return document.querySelector('.tree img').naturalWidth") > 100
        screenshot = SCREENSHOT or str(tmp_path / "page.png")
        browser.save_screenshot(screenshot)
        with open(screenshot, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"

        submit("")  # bad input: its message, and no results
        wait.until(expected_conditions.visibility_of_element_located((By.ID, "message")))
        assert "nothing to translate" in browser.find_element(By.ID, "message").text
        assert not browser.find_elements(By.CSS_SELECTOR, ".translation")
        submit(GERMAN[0])  # and the page goes on
        assert browser.find_element(By.CSS_SELECTOR, ".run .translation").text == translated[GERMAN[0]]
        assert not browser.find_element(By.ID, "message").is_displayed()
    finally:
        browser.quit()


@pytest.mark.slow
def test_the_page_listens_on_this_machine_only(page):
    port = int(page.rstrip("/").rsplit(":", 1)[1])
    addresses = subprocess.run(["hostname", "-I"], capture_output=True, text=True).stdout.split()
    others = [a for a in addresses if not a.startswith("127.") and ":" not in a]
    if not others:
        pytest.skip("this machine has no IPv4 address but loopback")
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((others[0], port), timeout=10)

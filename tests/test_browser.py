"""The browser game in a real headless browser: `python app.py` on the shipped SpriteWorld checkpoint, driven by
Selenium through Chromium (Debian's chromium + chromium-driver packages; `make browser` installs them). Two turns
(one from the dropdowns, one typed), undo, save, load; screenshots in the test's tmp dir."""

import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from animegamer.config import load_config
from animegamer.data.vocabulary import load_vocabulary
from tests.helpers.stage_scripts import free_port

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "spriteworld" / "inference.yaml"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
pytestmark = [pytest.mark.slow, pytest.mark.skipif(CHROMIUM is None or CHROMEDRIVER is None,
                                reason="no Chromium + chromedriver on this machine (`make browser` installs them)")]
TIMEOUT = 240  # seconds for a turn on shared CPU cores


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """app.py in its own process on a free port; yields (url, output_dir)."""
    out = tmp_path_factory.mktemp("web")
    port = free_port()
    log = open(out.parent / "app.log", "w+")
    process = subprocess.Popen(
        [sys.executable, "app.py", "--config", str(CONFIG), "--port", str(port), f"output_dir={out}",
         "sampling.steps=6"],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + TIMEOUT
        while True:
            if process.poll() is not None:
                log.seek(0)
                pytest.fail(f"app.py exited with {process.returncode}:\n{log.read()[-3000:]}")
            try:
                urllib.request.urlopen(url, timeout=2).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail("app.py did not answer within the time limit")
                time.sleep(0.5)
        yield url, out
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()


@pytest.fixture(scope="module")
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,1800"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def wait_for(driver, condition, what: str, timeout: float = TIMEOUT):
    """Poll ``condition(driver)`` until it is truthy; its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = condition(driver)
        except Exception:  # the page re-renders under us: try again
            value = None
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}; status: {status(driver)!r}")


def status(driver) -> str:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.ID, "status").text


def history(driver) -> list[list[str]]:
    """The history table's rows as the page holds them: Gradio's grid cells carry their row and column."""
    cells = driver.execute_script(
        "return [...document.querySelectorAll('#history [data-row][data-col]')].map(cell => "
        "[+cell.dataset.row, +cell.dataset.col, cell.textContent.trim()])")
    rows: dict[int, dict[int, str]] = {}
    for row, col, text in cells:
        rows.setdefault(row, {})[col] = text
    return [[cols[c] for c in sorted(cols)] for _, cols in sorted(rows.items())]


def choose(driver, field: str, option: str) -> list[str]:
    """Open a dropdown, click ``option`` in its list; returns every option it offered."""
    from selenium.webdriver.common.by import By

    options = f"#field-{field} li[role=option]"
    driver.find_element(By.CSS_SELECTOR, f"#field-{field} input").click()
    items = wait_for(driver, lambda d: d.find_elements(By.CSS_SELECTOR, options), f"the {field} options", timeout=20)
    offered = [item.get_attribute("textContent").strip().removeprefix("✓").strip() for item in items]  # ✓: hidden mark
    assert option in offered, offered
    items[offered.index(option)].click()
    wait_for(driver, lambda d: not d.find_elements(By.CSS_SELECTOR, options), f"the {field} list to close", timeout=20)
    assert driver.find_element(By.CSS_SELECTOR, f"#field-{field} input").get_attribute("value") == option
    return offered


# records every "denoising k/N" the page shows (Gradio's progress bar); a poll could miss a short turn's
WATCH_PROGRESS = """
window.agProgress = [];
new MutationObserver(() => {
  const found = document.body.innerText.match(/denoising \\d+\\/\\d+/);
  if (found && !window.agProgress.includes(found[0])) window.agProgress.push(found[0]);
}).observe(document.body, {subtree: true, childList: true, characterData: true});
"""


def play_and_watch(driver, turn: int) -> list[str]:
    """Click Play and wait for the turn's result; the progress texts shown on the way."""
    from selenium.webdriver.common.by import By

    driver.execute_script(WATCH_PROGRESS)
    driver.find_element(By.ID, "play").click()
    wait_for(driver, lambda d: f"Turn {turn}:" in status(d) and len(history(d)) == turn + 1, f"turn {turn}")
    return driver.execute_script("return window.agProgress")


def test_two_turns_undo_save_load_in_chromium(server, browser, tmp_path):
    from selenium.webdriver.common.by import By

    url, out = server
    browser.get(url)
    wait_for(browser, lambda d: d.find_elements(By.ID, "play"), "the page")
    # the world's vocabulary (the shipped checkpoint's): an example instruction from it, its words offered as choices
    vocab = load_vocabulary(load_config(CONFIG).mllm_checkpoint)
    hero = vocab.characters[0]
    placeholder = browser.find_element(By.CSS_SELECTOR, "#free-text textarea, #free-text input")
    assert placeholder.get_attribute("placeholder") == vocab.placeholder()
    assert browser.find_element(By.CSS_SELECTOR, "#field-character input").get_attribute("value") == hero
    assert "read a book" in choose(browser, "motion", "eat")
    assert choose(browser, "adverb", "happily")[:2] == list(vocab.adverbs[:2])
    assert "morning kitchen" in choose(browser, "background", "morning kitchen")
    # read-only bars: a picture of three bars, nothing to drag
    assert not browser.find_elements(By.CSS_SELECTOR, "#bars input")
    assert [b.get_attribute("data-value") for b in browser.find_elements(By.CSS_SELECTOR, "#bars .ag-bar")] == \
        ["50", "50", "50"]
    browser.save_screenshot(str(tmp_path / "0_start.png"))

    seen = play_and_watch(browser, 0)  # from the dropdowns
    # the progress bar while the turn ran (sampling.steps=6; Gradio may skip updates that come close together)
    assert seen and all(text.endswith("/6") for text in seen), seen
    assert history(browser)[0][1] == f"Character: {hero}; Motion: happily eat; Background: morning kitchen."
    video = browser.find_element(By.CSS_SELECTOR, "#clip video")
    width, height, video_height = browser.execute_script(
        "const r = arguments[0].getBoundingClientRect(); return [r.width, r.height, arguments[0].videoHeight]", video)
    assert height >= 300 and video_height >= 6 * 64  # shown large, enlarged from the 64-row clip
    browser.save_screenshot(str(tmp_path / "1_turn0.png"))

    typed = "Character: Qiqi; Motion: quickly fly; Background: noon moon."  # 'moon': never seen in training
    browser.find_element(By.CSS_SELECTOR, "#free-text textarea, #free-text input").send_keys(typed)
    play_and_watch(browser, 1)
    assert "never seen in training" in status(browser) and "'moon'" in status(browser)
    rows = history(browser)
    assert [r[0] for r in rows] == ["0", "1"] and rows[1][1] == typed
    # the history table fits its box: no horizontal scrolling
    assert browser.execute_script(
        "return [...document.querySelectorAll('#history *')].every(e => e.scrollWidth <= e.clientWidth + 1 "
        "|| getComputedStyle(e).overflowX == 'visible')")
    bars = {b.get_attribute("data-name"): b.get_attribute("data-value")
            for b in browser.find_elements(By.CSS_SELECTOR, "#bars .ag-bar")}
    assert bars["stamina"] == rows[1][6].split(" · ")[0]
    browser.save_screenshot(str(tmp_path / "2_turn1.png"))

    browser.find_element(By.ID, "undo").click()
    wait_for(browser, lambda d: "Undid turn 1" in status(d) and len(history(d)) == 1, "undo")
    assert history(browser)[0][0] == "0"

    browser.find_element(By.ID, "save").click()
    wait_for(browser, lambda d: "Saved 1 turns" in status(d), "save")
    saves = list(out.glob("game_*/game.save"))
    assert len(saves) == 1

    browser.find_element(By.CSS_SELECTOR, "#load-file input[type=file]").send_keys(str(saves[0]))
    wait_for(browser, lambda d: ".save" in d.find_element(By.ID, "load-file").text, "the upload")  # "game\n.save"
    browser.find_element(By.ID, "load").click()
    wait_for(browser, lambda d: "Loaded 1 turns" in status(d) and len(history(d)) == 1, "load")
    assert history(browser)[0][1] == f"Character: {hero}; Motion: happily eat; Background: morning kitchen."
    assert browser.find_element(By.CSS_SELECTOR, "#clip video").get_attribute("src")
    browser.save_screenshot(str(tmp_path / "3_loaded.png"))
    # the loaded game plays in a directory of its own; the game it replaced is freed, its folder with it (the
    # player keeps what they downloaded)
    games = list(out.glob("game_*"))
    assert len(games) == 1 and games[0] != saves[0].parent and not saves[0].parent.exists()

"""The page at / of `attn serve`, in a real headless browser (Debian's chromium and chromium-driver,
driven by selenium): it translates what is typed as POST /v1/translate does, draws each attention
as one cell per (query token, key token), shows the chosen layer's and head's weights, names a
cell's tokens and weight on hover, and shows the server's errors (here asked for by Ctrl+Enter).

A random two-layer model is served from a checkpoint the test writes; `attn serve` runs as a
subprocess on a free port. With ATTN_PAGE_SCREENSHOT=FILE.png the test saves the page there.
"""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import replace

import pytest
import torch
from support.models import small_model
from support.runs import REPO, checkpoint_parts

pytestmark = pytest.mark.browser
pytest.importorskip("fastapi", reason="attn serve needs the serve extra: pip install -e '.[serve]'")
webdriver = pytest.importorskip(
    "selenium.webdriver", reason="the page is tested with selenium: pip install -e '.[test]'"
)

from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support.ui import Select, WebDriverWait  # noqa: E402

from bench.toolkit import CHROMEDRIVER, CHROMIUM, chromium_options  # noqa: E402

# Sentences of the tokenizer's own training text, of different lengths, so that picking the
# second one changes every grid's size. Two lines: the page shows a row for each.
TEXT = "sentence number 5\nsentence number 123 and 45"
BEAM, N_BEST = 3, 2
WAIT = 30  # seconds: the longest any step may take before the test fails


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """`attn serve --checkpoint` of a random model with two encoder and two decoder layers of four
    heads, from this repository's code; yields its base URL and stops it afterwards."""
    from attn_cli.checkpoint import save_checkpoint

    work = tmp_path_factory.mktemp("serve-page")
    config, tokenizers, _ = checkpoint_parts()
    config = replace(config, model=replace(config.model, encoder_layers=2, decoder_layers=2))
    vocab = tokenizers.source.vocab_size
    torch.manual_seed(0)  # module-scoped: before the autouse seed of each test
    model = small_model(src_vocab_size=vocab, tgt_vocab_size=vocab, encoder_layers=2, decoder_layers=2)
    save_checkpoint(work / "model.pt", config, tokenizers, model, step=1, epoch=0)

    port, log_path = free_port(), work / "serve.log"
    # PYTHONPATH: the subprocess serves this checkout's page even where another checkout is installed.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    command = [sys.executable, "-m", "attn_cli", "serve", "--checkpoint", str(work / "model.pt")]
    command += ["--port", str(port), "--threads", "1"]
    with open(log_path, "w", encoding="utf-8") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + WAIT
        while True:
            assert process.poll() is None, f"attn serve exited with {process.returncode}:\n{log_path.read_text()}"
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2):
                    break
            except OSError:
                assert time.monotonic() < deadline, f"attn serve did not answer in {WAIT} s:\n{log_path.read_text()}"
                time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    missing = [str(path) for path in (CHROMIUM, CHROMEDRIVER) if not path.exists()]
    if missing:
        reason = f"no {' or '.join(missing)}: apt-get install chromium chromium-driver (.ci/run does)"
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the browser test, but there is {reason}")
        pytest.skip(reason)
    options = chromium_options(tmp_path_factory.mktemp("chromium"), 1400, 1000)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # the console, for its errors
    browser = webdriver.Chrome(options=options, service=Service(str(CHROMEDRIVER)))
    try:
        yield browser
    finally:
        browser.quit()


def api_translate(url: str, body: dict) -> dict:
    request = urllib.request.Request(
        f"{url}/v1/translate", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=WAIT) as response:
        return json.load(response)


def set_number(driver, element_id: str, value: int) -> None:
    field = driver.find_element(By.ID, element_id)
    field.clear()
    field.send_keys(str(value))


def translate_on_page(driver, url: str, text: str, beam: int = BEAM, keyboard: bool = False) -> None:
    """Load the page, type `text` with the test's beam and n-best, and press Translate (or Ctrl+Enter)."""
    driver.get(f"{url}/")
    WebDriverWait(driver, WAIT).until(lambda d: d.find_elements(By.CSS_SELECTOR, "#model option"))
    set_number(driver, "beam-size", beam)
    set_number(driver, "n-best", N_BEST)
    source = driver.find_element(By.ID, "source")
    source.send_keys(text)  # Enter in a textarea is a new line
    if keyboard:
        source.send_keys(Keys.CONTROL, Keys.ENTER)
    else:
        driver.find_element(By.ID, "translate").click()


def wait_for_answer(driver) -> None:
    WebDriverWait(driver, WAIT).until(
        lambda d: (
            d.find_elements(By.CSS_SELECTOR, "#sentences .sentence") or d.find_element(By.ID, "error").is_displayed()
        )
    )
    error = driver.find_element(By.ID, "error")
    assert not error.is_displayed(), f"the page shows an error: {error.text}"


@pytest.fixture(scope="module")
def translated(server, driver):
    """The page after translating TEXT and picking its second sentence, and what POST /v1/translate
    answers for the same text and options, fetched directly."""
    translate_on_page(driver, server, TEXT)
    wait_for_answer(driver)
    answer = api_translate(
        server,
        {"q": TEXT, "model": "en-zh", "beam_size": BEAM, "n_best": N_BEST, "attention": True, "alignment": True},
    )
    driver.find_elements(By.CSS_SELECTOR, "#sentences .sentence")[1].click()
    WebDriverWait(driver, WAIT).until(
        lambda d: (
            "sentence 2" in d.find_element(By.ID, "attention-sentence").text
            and d.find_elements(By.CSS_SELECTOR, "#heatmap-cross .cell")
        )
    )
    if os.environ.get("ATTN_PAGE_SCREENSHOT"):
        driver.save_screenshot(os.environ["ATTN_PAGE_SCREENSHOT"])
    return answer


def count(driver, selector: str) -> int:
    return driver.execute_script("return document.querySelectorAll(arguments[0]).length", selector)


def texts(driver, selector: str) -> list[str]:
    """The text of each element `selector` finds, as it is (WebElement.text trims whitespace)."""
    script = "return Array.from(document.querySelectorAll(arguments[0]), (node) => node.textContent)"
    return driver.execute_script(script, selector)


def cells(driver, kind: str) -> dict[tuple[int, int], float]:
    """Every cell of a heatmap as (row, col) -> weight, read in one call (not one per cell)."""
    found = driver.execute_script(
        "return Array.from(document.querySelectorAll(arguments[0]),"
        " (c) => [Number(c.dataset.row), Number(c.dataset.col), c.dataset.weight]);",
        f"#heatmap-{kind} .cell",
    )
    grid = {(row, col): float(weight) for row, col, weight in found}
    assert len(grid) == len(found), f"{kind}: two cells at one (row, col)"
    return grid


def assert_shows(driver, kind: str, expected: list[list[float]]) -> None:
    shown = cells(driver, kind)
    wanted = {(row, col): weight for row, weights in enumerate(expected) for col, weight in enumerate(weights)}
    assert shown.keys() == wanted.keys()
    wrong = [(key, shown[key], wanted[key]) for key in wanted if abs(shown[key] - wanted[key]) > 1e-9]
    assert not wrong, f"{kind}: {len(wrong)} cells differ from the response, e.g. ((row, col), shown, sent) {wrong[:3]}"


def test_the_page_shows_the_translation_post_v1_translate_gives(translated, driver, server):
    text = driver.execute_script("return document.getElementById('translation').textContent")
    assert text == translated["translations"][0]["translation"]
    sentences = translated["translations"][0]["sentences"]
    assert all(sentence["translation"] for sentence in sentences), "the random model should say something"
    assert count(driver, "#sentences .sentence") == len(sentences) == 2
    for number, sentence in enumerate(sentences, start=1):
        row = f"#sentences .sentence:nth-child({number})"
        assert texts(driver, f"{row} .sentence-translation") == [sentence["translation"]]
        assert texts(driver, f"{row} .nbest-translation") == [
            hypothesis["translation"] for hypothesis in sentence["n_best"]
        ]
        assert len(sentence["n_best"]) == N_BEST
    # Offline: everything the page loaded came from the server itself, no CDN.
    loaded = driver.execute_script("return performance.getEntriesByType('resource').map((entry) => entry.name)")
    assert loaded and all(name.startswith(f"{server}/") for name in loaded), loaded
    errors = [entry["message"] for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]
    assert not errors, f"the browser's console has errors: {errors}"


def test_each_heatmap_has_one_cell_per_query_and_key_token(translated, driver):
    attention = translated["translations"][0]["sentences"][1]["attention"]
    first = translated["translations"][0]["sentences"][0]["attention"]
    assert len(attention["source_tokens"]) != len(first["source_tokens"]), "the second sentence should differ"
    sources, inputs, outputs = (attention[key] for key in ("source_tokens", "decoder_input_tokens", "output_tokens"))
    assert count(driver, "#heatmap-cross .cell") == len(outputs) * len(sources)
    assert count(driver, "#heatmap-encoder .cell") == len(sources) ** 2
    assert count(driver, "#heatmap-decoder_self .cell") == len(outputs) * len(inputs)
    # The tokens on the axes, in order: columns above the grid, rows beside it.
    labels = "return Array.from(document.querySelectorAll(arguments[0]), (label) => label.title);"
    assert driver.execute_script(labels, "#heatmap-cross .col-label") == sources
    assert driver.execute_script(labels, "#heatmap-cross .row-label") == outputs
    assert driver.execute_script(labels, "#heatmap-decoder_self .col-label") == inputs


def test_the_layer_and_head_selectors_show_that_heads_weights(translated, driver):
    attention = translated["translations"][0]["sentences"][1]["attention"]
    # First shown: the last layer, the mean of its heads, as attn translate --show-attention shows.
    for kind in ("encoder", "decoder_self", "cross"):
        heads = attention[kind][-1]
        mean = [
            [sum(grid[q][k] for grid in heads) / len(heads) for k in range(len(heads[0][0]))]
            for q in range(len(heads[0]))
        ]
        assert_shows(driver, kind, mean)
    Select(driver.find_element(By.ID, "encoder-layer")).select_by_value("0")
    Select(driver.find_element(By.ID, "decoder-layer")).select_by_value("0")
    Select(driver.find_element(By.ID, "head")).select_by_value("2")
    for kind in ("encoder", "decoder_self", "cross"):
        assert attention[kind][0][2] != attention[kind][1][2], f"{kind}: layers 0 and 1 should differ"
        assert_shows(driver, kind, attention[kind][0][2])
    Select(driver.find_element(By.ID, "decoder-layer")).select_by_value("1")
    Select(driver.find_element(By.ID, "head")).select_by_value("1")
    assert_shows(driver, "cross", attention["cross"][1][1])
    assert_shows(driver, "decoder_self", attention["decoder_self"][1][1])
    assert_shows(driver, "encoder", attention["encoder"][0][1])


def test_a_cell_names_its_tokens_and_weight_on_hover(translated, driver):
    attention = translated["translations"][0]["sentences"][1]["attention"]
    Select(driver.find_element(By.ID, "decoder-layer")).select_by_value("1")
    Select(driver.find_element(By.ID, "head")).select_by_value("0")
    row, col = 1, 2
    cell = driver.find_element(By.CSS_SELECTOR, f'#heatmap-cross .cell[data-row="{row}"][data-col="{col}"]')
    title = cell.get_attribute("title")
    tokens, weight = title.rsplit(": ", 1)
    assert tokens == f"{attention['output_tokens'][row]} → {attention['source_tokens'][col]}"
    assert abs(float(weight) - attention["cross"][1][0][row][col]) <= 0.005 + 1e-9
    ActionChains(driver).move_to_element(cell).perform()
    assert driver.find_element(By.ID, "readout-cross").text == title


def test_a_server_error_is_shown_on_the_page(server, driver):
    translate_on_page(driver, server, "sentence number 7", beam=99, keyboard=True)
    error = driver.find_element(By.ID, "error")
    WebDriverWait(driver, WAIT).until(lambda d: error.is_displayed())
    assert "beam_size: 99 is more than this server's 16" in error.text


def test_a_hundred_pasted_lines_are_translated_without_attention_and_the_page_says_why(server, driver):
    lines = [f"sentence number {i}" for i in range(100)]
    driver.get(f"{server}/")
    WebDriverWait(driver, WAIT).until(lambda d: d.find_elements(By.CSS_SELECTOR, "#model option"))
    # pasted, as a user would: one value set at once, not typed key by key
    driver.execute_script("document.getElementById('source').value = arguments[0]", "\n".join(lines))
    driver.find_element(By.ID, "translate").click()
    WebDriverWait(driver, WAIT).until(lambda d: count(d, "#sentences .sentence") == 100)
    assert not driver.find_element(By.ID, "error").is_displayed()
    note = driver.find_element(By.ID, "attention-note")
    assert note.is_displayed() and "up to 16 lines" in note.text and "these 100 lines" in note.text
    # unticked, a short text is translated without attention too, and no note is needed
    driver.find_element(By.ID, "show-attention").click()
    driver.execute_script("document.getElementById('source').value = arguments[0]", "sentence number 7")
    driver.find_element(By.ID, "translate").click()
    WebDriverWait(driver, WAIT).until(lambda d: count(d, "#sentences .sentence") == 1)
    assert not note.is_displayed() and not driver.find_element(By.ID, "attention-panel").is_displayed()


def test_a_refused_request_leaves_no_older_translation_on_the_page(server, driver):
    translate_on_page(driver, server, "sentence number 7")
    wait_for_answer(driver)
    set_number(driver, "beam-size", 99)
    driver.find_element(By.ID, "translate").click()
    error = driver.find_element(By.ID, "error")
    WebDriverWait(driver, WAIT).until(lambda d: error.is_displayed())
    assert not driver.find_element(By.ID, "output-panel").is_displayed()
    assert count(driver, "#sentences .sentence") == 0

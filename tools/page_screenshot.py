"""The screenshot of the page of `attn serve` in docs/serve-page.png: serve a run on a free port,
open the page in headless Chromium, translate the sentences, pick the first one and save the page.

    python3 -m tools.page_screenshot                                   # runs/en-zh
    python3 -m tools.page_screenshot --run runs/en-zh "It is raining." "Where is the station?"
    python3 -m tools.page_screenshot --checkpoint model.pt --output /tmp/page.png

(from the repository root: the server is started with bench/toolkit.py's ServerProcess.)

Needs selenium (in the test extra) and Debian's chromium and chromium-driver; Chinese output needs
a CJK font too (apt-get install fonts-noto-cjk or fonts-wqy-microhei), or it shows as boxes.
"""

from __future__ import annotations

import argparse
import base64
import os
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

from bench.toolkit import CHROMEDRIVER, CHROMIUM, REPO, ServerProcess, chromium_options, free_port

SENTENCES = ["I love machine learning.", "The weather is nice today."]


@contextmanager
def served(model_args: list[str], log_path: Path, startup_seconds: float = 120.0):
    """`attn serve` with `model_args` on a free 127.0.0.1 port, from this repository; yields its base URL."""
    port = free_port()
    command = [sys.executable, "-m", "attn_cli", "serve", *model_args, "--port", str(port)]
    server = ServerProcess("attn serve", command, port, log_path, cwd=REPO)
    server.start(startup_seconds)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop(15)


@contextmanager
def headless_chromium(width: int, height: int):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    with tempfile.TemporaryDirectory(prefix="attn-chromium-") as profile:
        options = chromium_options(Path(profile), width, height)
        driver = webdriver.Chrome(options=options, service=Service(str(CHROMEDRIVER)))
        try:
            yield driver
        finally:
            driver.quit()


def translate_on_page(driver, url: str, text: str, timeout: float = 60.0) -> None:
    """Load the page, type `text`, press Translate and wait for the first sentence's heatmaps."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(driver, timeout)
    driver.get(f"{url}/")
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#model option"))
    source = driver.find_element(By.ID, "source")
    source.clear()
    source.send_keys(text)
    driver.find_element(By.ID, "translate").click()
    wait.until(
        lambda d: (
            d.find_elements(By.CSS_SELECTOR, "#sentences .sentence") or d.find_element(By.ID, "error").is_displayed()
        )
    )
    error = driver.find_element(By.ID, "error")
    if error.is_displayed():
        raise RuntimeError(f"the page shows an error: {error.text}")
    first = driver.find_element(By.CSS_SELECTOR, "#sentences .sentence")
    first.click()
    wait.until(expected_conditions.visibility_of_element_located((By.CSS_SELECTOR, "#heatmap-cross .cell")))


def full_page_png(driver, width: int, least_height: int) -> bytes:
    """The whole page as PNG, `width` CSS pixels wide: the viewport is set to the page's height
    (the window's own size counts the browser's bars in, even headless)."""

    def viewport(height: int) -> None:
        metrics = {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}
        driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)

    viewport(least_height)
    viewport(max(least_height, driver.execute_script("return document.documentElement.scrollHeight")))
    return base64.b64decode(driver.execute_cdp_cmd("Page.captureScreenshot", {"format": "png"})["data"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sentences", nargs="*", default=SENTENCES, help="Sentences to translate, one line each.")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--run", default="runs/en-zh", help="Run directory to serve (default runs/en-zh).")
    group.add_argument("--checkpoint", help="A checkpoint file to serve instead of a run.")
    parser.add_argument("--output", default=str(REPO / "docs" / "serve-page.png"), help="The PNG to write.")
    parser.add_argument("--width", type=int, default=1400)
    parser.add_argument("--height", type=int, default=1000)
    args = parser.parse_args()
    if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
        sys.exit(f"needs {CHROMIUM} and {CHROMEDRIVER}: apt-get install chromium chromium-driver")
    model_args = ["--checkpoint", args.checkpoint] if args.checkpoint else ["--run", str(Path(args.run).resolve())]
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        with (
            served(model_args, Path(scratch) / "serve.log") as url,
            headless_chromium(args.width, args.height) as driver,
        ):
            translate_on_page(driver, url, "\n".join(args.sentences))
            output.write_bytes(full_page_png(driver, args.width, args.height))
    print(f"wrote {output}")


if __name__ == "__main__":
    main()

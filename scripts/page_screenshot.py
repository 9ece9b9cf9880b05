"""Saves a picture of the search page: a collection chosen, a sentence searched, the grid of results loaded.

    python page_screenshot.py BASE_URL COLLECTION QUERY OUT.png     (scripts/page-screenshot.sh runs it)
"""

import base64
import os
import sys

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.select import Select
from selenium.webdriver.support.ui import WebDriverWait

base, collection, query, out = sys.argv[1:5]
opts = webdriver.ChromeOptions()
opts.binary_location = os.environ.get("CHROMIUM", "/usr/bin/chromium")
for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,900",
          "--hide-scrollbars"):
    opts.add_argument(a)
d = webdriver.Chrome(options=opts, service=Service(os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver")))
try:
    d.get(base + "/")
    wait = WebDriverWait(d, 60, poll_frequency=0.2)
    wait.until(lambda drv: any(o.get_attribute("value") == collection
                               for o in drv.find_elements(By.CSS_SELECTOR, "#collection option")))
    Select(d.find_element(By.ID, "collection")).select_by_value(collection)
    d.find_element(By.ID, "query").send_keys(query)
    d.find_element(By.CSS_SELECTOR, "#text-form [type=submit]").click()
    wait.until(lambda drv: len(drv.find_elements(By.CSS_SELECTOR, "#results .card")) > 0)
    wait.until(lambda drv: drv.execute_script(
        "return [...document.querySelectorAll('#results .card img')]"
        ".every(i => i.complete && i.naturalWidth > 0);"))
    # The whole page down to the pager, at desktop width (Chrome's own full-page capture).
    size = d.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]
    shot = d.execute_cdp_cmd("Page.captureScreenshot", {
        "format": "png", "captureBeyondViewport": True,
        "clip": {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1},
    })
    with open(out, "wb") as f:
        f.write(base64.b64decode(shot["data"]))
    print(f"{out}: {len(d.find_elements(By.CSS_SELECTOR, '#results .card'))} results for {query!r}")
finally:
    d.quit()

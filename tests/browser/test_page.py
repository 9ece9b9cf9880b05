"""The search page in a real browser (Debian's chromium, driven by Selenium), against a running server.

scripts/browser-test.sh starts the server (fixture bundle, scratch database, an admin key, a small body limit)
and runs this with JOINTSPACE_URL, JOINTSPACE_KEY, JOINTSPACE_MAX_REQUEST_BYTES, BROWSER_PHOTOS (three or more
photo files, one per line) and BROWSER_SHOTS (where screenshots go). Every check is on what a person sees:
messages, cards, captions, the dialog.
"""

import json
import os
import re
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.common.exceptions import TimeoutException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.select import Select
from selenium.webdriver.support.ui import WebDriverWait

BASE = os.environ["JOINTSPACE_URL"]
KEY = os.environ["JOINTSPACE_KEY"]
PHOTOS = [p for p in os.environ["BROWSER_PHOTOS"].splitlines() if p.strip()]
SHOTS = Path(os.environ.get("BROWSER_SHOTS", "target/browser"))
CAPTION = "a photo added by the browser test"
LIMIT = int(os.environ["JOINTSPACE_MAX_REQUEST_BYTES"])


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    opts = webdriver.ChromeOptions()
    opts.binary_location = os.environ.get("CHROMIUM", "/usr/bin/chromium")
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,1000"):
        opts.add_argument(a)
    # Console messages, to catch script errors and anything the Content-Security-Policy blocked.
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(executable_path=os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver"))
    d = webdriver.Chrome(options=opts, service=service)
    d.implicitly_wait(0)
    SHOTS.mkdir(parents=True, exist_ok=True)
    yield d
    d.quit()


def until(d, what, check, timeout=30):
    """Waits for `check(d)` to hold; fails saying what a person would have waited for (`what`, or what it
    returns then) and what they see."""
    try:
        return WebDriverWait(d, timeout, poll_frequency=0.1).until(check)
    except TimeoutException:
        what = what() if callable(what) else what
        raise AssertionError(
            f"{what}: not within {timeout} s; the error box shows {visible_text(d, 'error')!r}, "
            f"the status line {visible_text(d, 'status')!r}"
        ) from None


def visible_text(d, element_id):
    el = d.find_element(By.ID, element_id)
    return el.text if el.is_displayed() else ""


def wait_text(d, element_id, pattern, timeout=30):
    """Waits until the element is shown with text matching `pattern`; returns the text."""
    rx = re.compile(pattern)

    def seen(drv):
        t = visible_text(drv, element_id)
        return t if rx.search(t) else False

    return until(d, lambda: f"#{element_id} shows /{pattern}/ (it shows {visible_text(d, element_id)!r})", seen,
                 timeout)


def cards(d):
    return d.find_elements(By.CSS_SELECTOR, "#results .card")


def wait_cards(d, n):
    until(d, lambda: f"{n} result cards (there are {len(cards(d))})", lambda drv: len(cards(drv)) == n)
    return cards(d)


def selected(d):
    return Select(d.find_element(By.ID, "collection")).first_selected_option.text


def thumbnails_shown(d, selector):
    """Whether every image under `selector` has loaded pixels (a thumbnail a person can see)."""
    return d.execute_script(
        "const imgs = [...document.querySelectorAll(arguments[0])];"
        "return imgs.length > 0 && imgs.every(i => i.complete && i.naturalWidth > 0);",
        selector,
    )


def submit(d, form_id):
    d.find_element(By.CSS_SELECTOR, f"#{form_id} [type=submit]").click()


def open_details(d, details_id):
    el = d.find_element(By.ID, details_id)
    if el.get_attribute("open") is None:
        el.find_element(By.TAG_NAME, "summary").click()


def create_collection(d, name, text_fields=""):
    """Creates a collection through the page's form and waits for the page to say so."""
    open_details(d, "new-collection")
    d.find_element(By.ID, "new-name").send_keys(name)
    if text_fields:
        d.find_element(By.ID, "new-text-fields").send_keys(text_fields)
    submit(d, "create-form")
    wait_text(d, "status", f"Collection “{name}” created")


def score_of(card):
    return float(card.find_element(By.CLASS_NAME, "score").text)


def test_a_person_adds_photos_searches_and_browses(browser, tmp_path):
    d = browser
    d.get(BASE + "/")
    assert "jointspace" in d.title

    # The server has keys: without one the page says what to do.
    wait_text(d, "error", r"needs an API key")
    d.find_element(By.ID, "api-key").send_keys(KEY)
    submit(d, "key-form")
    wait_text(d, "status", r"Key set")
    assert not d.find_element(By.ID, "error").is_displayed()
    wait_text(d, "collection", r"no collections yet")

    # A collection, created through the page.
    create_collection(d, "holiday")
    until(d, "the new collection is chosen", lambda drv: selected(drv) == "holiday (0 photos)")

    # Three photos with a caption and metadata.
    open_details(d, "add-photos")
    d.find_element(By.ID, "upload-files").send_keys("\n".join(PHOTOS[:3]))
    d.find_element(By.ID, "upload-caption").send_keys(CAPTION)
    d.find_element(By.ID, "upload-metadata").send_keys(json.dumps({"set": "browser"}))
    submit(d, "upload-form")
    wait_text(d, "status", r"Added 3 of 3 photos to “holiday”", timeout=120)
    until(d, "the collection counts three photos", lambda drv: selected(drv) == "holiday (3 photos)")

    # A file that is not a photo: named, with the server's reason.
    bad = tmp_path / "notes.txt"
    bad.write_text("these are not pixels\n")
    d.find_element(By.ID, "upload-metadata").clear()
    d.find_element(By.ID, "upload-files").send_keys(str(bad))
    submit(d, "upload-form")
    error = wait_text(d, "error", r"notes\.txt")
    assert "not an image" in error, error
    wait_text(d, "status", r"Added 0 of 1 photo")

    # A file over the server's request limit (1 MiB here): the limit is stated.
    big = tmp_path / "huge.jpg"
    big.write_bytes(b"\xff" * (2 << 20))
    d.find_element(By.ID, "upload-files").send_keys(str(big))
    submit(d, "upload-form")
    error = wait_text(d, "error", r"huge\.jpg")
    assert "Too large" in error and f"the limit is {LIMIT} bytes" in error, error

    # A sentence: a grid of three cards, each with its thumbnail and a score, best first.
    d.find_element(By.ID, "query").send_keys("a dog runs across the grass")
    submit(d, "text-form")
    found = wait_cards(d, 3)
    wait_text(d, "results-title", r"Photos for “a dog runs across the grass”")
    assert not d.find_element(By.ID, "error").is_displayed()
    scores = [score_of(c) for c in found]
    assert scores == sorted(scores, reverse=True), scores
    until(d, "every card shows its thumbnail", lambda drv: thumbnails_shown(drv, "#results .card img"))
    d.save_screenshot(str(SHOTS / "search.png"))

    # Open a result: its facts, its caption, and the captions that describe it best.
    first = found[0]
    name = first.find_element(By.CLASS_NAME, "card-name").text
    first.find_element(By.TAG_NAME, "button").click()
    until(d, "the photo's dialog opens", lambda drv: drv.find_element(By.ID, "detail").is_displayed())
    wait_text(d, "detail-title", re.escape(f"Photo {name}"))
    facts = d.find_element(By.ID, "detail-facts").text
    assert "set" in facts and "browser" in facts, facts
    assert CAPTION in d.find_element(By.ID, "detail-captions").text
    wait_text(d, "detail-annotation", re.escape(CAPTION))
    until(d, "the dialog shows the thumbnail", lambda drv: thumbnails_shown(drv, "#detail-img"))
    d.save_screenshot(str(SHOTS / "detail.png"))

    # More like this: the two other photos (the API leaves the photo itself out).
    d.find_element(By.ID, "more-like-this").click()
    until(d, "the dialog closes", lambda drv: not drv.find_element(By.ID, "detail").is_displayed())
    wait_text(d, "results-title", re.escape(f"More like photo {name}"))
    similar = wait_cards(d, 2)
    assert name not in [c.find_element(By.CLASS_NAME, "card-name").text for c in similar]
    until(d, "every card shows its thumbnail", lambda drv: thumbnails_shown(drv, "#results .card img"))

    # By keyboard: a card is a button; Enter opens it and Escape closes the dialog.
    button = similar[1].find_element(By.TAG_NAME, "button")
    assert button.tag_name == "button"
    button.send_keys(Keys.ENTER)
    until(d, "the photo's dialog opens", lambda drv: drv.find_element(By.ID, "detail").is_displayed())
    assert d.switch_to.active_element == d.find_element(By.ID, "detail-close")
    d.switch_to.active_element.send_keys(Keys.ESCAPE)
    until(d, "the dialog closes", lambda drv: not drv.find_element(By.ID, "detail").is_displayed())

    # Filters on metadata: one that matches nothing, then one that matches every photo.
    open_details(d, "filters")
    d.find_element(By.ID, "add-filter").click()
    key, value = d.find_elements(By.CSS_SELECTOR, "#filter-rows input")
    key.send_keys("set")
    value.send_keys("elsewhere")
    submit(d, "text-form")
    wait_text(d, "results-empty", r"No photos found with these filters")
    assert cards(d) == []
    value.clear()
    value.send_keys("browser")
    submit(d, "text-form")
    wait_cards(d, 3)
    # The API's other operators: every photo has set = "browser", so "≠" and "is missing" match none of them,
    # "exists" and "one of" browser all three, and "one of" two other values none.
    operator = Select(d.find_element(By.CSS_SELECTOR, "#filter-rows select"))
    for label, found in [("≠", 0), ("is missing", 0), ("exists", 3), ("one of", 3)]:
        operator.select_by_visible_text(label)
        until(d, f"the operator shows {label}", lambda drv, label=label: operator.first_selected_option.text == label)
        submit(d, "text-form")
        if found:
            wait_cards(d, found)
        else:
            wait_text(d, "results-empty", r"No photos found with these filters")
    value.clear()
    value.send_keys("elsewhere, nowhere")
    submit(d, "text-form")
    wait_text(d, "results-empty", r"No photos found with these filters")
    value.clear()
    value.send_keys("elsewhere, browser")
    submit(d, "text-form")
    wait_cards(d, 3)

    # A photo from disk: similar photos, and the captions that describe it best.
    d.find_element(By.ID, "photo").send_keys(PHOTOS[0])
    wait_text(d, "results-title", r"Photos like ")
    wait_cards(d, 3)
    wait_text(d, "annotation", re.escape(CAPTION))
    assert d.find_element(By.ID, "query-photo-img").get_attribute("src").startswith("blob:")
    d.save_screenshot(str(SHOTS / "photo-search.png"))

    # Nothing the page runs failed (a script error, a script, style or image the policy refused). The API's
    # error answers above (401 before the key, 415 for the bad upload) are logged by the browser too.
    problems = [e["message"] for e in d.get_log("browser")
                if e["level"] == "SEVERE" and "Failed to load resource" not in e["message"]]
    assert problems == [], problems


def test_the_page_fits_a_phone(browser):
    d = browser
    d.set_window_size(390, 844)
    d.get(BASE + "/")
    # The key and collection are kept for the session (this tab).
    assert d.find_element(By.ID, "api-key").get_attribute("value") == KEY
    until(d, "the collection counts three photos", lambda drv: selected(drv) == "holiday (3 photos)")
    d.find_element(By.ID, "query").send_keys("people on a street")
    d.find_element(By.ID, "query").send_keys(Keys.ENTER)
    wait_cards(d, 3)
    until(d, "every card shows its thumbnail", lambda drv: thumbnails_shown(drv, "#results .card img"))
    overflow = d.execute_script("return document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 0, f"the page is {overflow} px wider than a phone's screen"
    d.save_screenshot(str(SHOTS / "phone.png"))


def test_results_come_in_pages(browser, tmp_path):
    d = browser
    d.set_window_size(1280, 1000)
    d.get(BASE + "/")
    create_collection(d, "many")
    # Thirteen photos (copies of the three), one more than the smallest page.
    source = [Path(p).read_bytes() for p in PHOTOS[:3]]
    files = []
    for i in range(13):
        f = tmp_path / f"copy-{i:02}{Path(PHOTOS[i % 3]).suffix}"
        f.write_bytes(source[i % 3])
        files.append(str(f))
    d.find_element(By.ID, "upload-files").send_keys("\n".join(files))
    submit(d, "upload-form")
    wait_text(d, "status", r"Added 13 of 13 photos to “many”", timeout=120)
    Select(d.find_element(By.ID, "per-page")).select_by_visible_text("12")
    d.find_element(By.ID, "query").send_keys("a photo")
    submit(d, "text-form")
    wait_cards(d, 12)
    wait_text(d, "page-info", r"^Results 1–12$")
    prev, nxt = d.find_element(By.ID, "prev"), d.find_element(By.ID, "next")
    assert not prev.is_enabled() and nxt.is_enabled()
    first_page = [c.text for c in cards(d)]
    nxt.click()
    wait_cards(d, 1)
    wait_text(d, "page-info", r"^Results 13–13$")
    assert prev.is_enabled() and not nxt.is_enabled()
    assert cards(d)[0].text not in first_page
    prev.click()
    wait_cards(d, 12)
    assert [c.text for c in cards(d)] == first_page


def test_a_person_matches_sentences_by_meaning_by_words_or_both(browser):
    d = browser
    d.set_window_size(1280, 1000)
    d.get(BASE + "/")
    # A collection whose "place" field a search by words reaches: its sentences match both ways by default.
    create_collection(d, "places", text_fields="place, shop.name")
    d.find_element(By.ID, "upload-files").send_keys("\n".join(PHOTOS[:2]))
    d.find_element(By.ID, "upload-caption").send_keys(CAPTION)
    d.find_element(By.ID, "upload-metadata").send_keys(json.dumps({"place": "harbour"}))
    submit(d, "upload-form")
    wait_text(d, "status", r"Added 2 of 2 photos to “places”", timeout=120)
    mode = Select(d.find_element(By.ID, "mode"))

    query = d.find_element(By.ID, "query")
    query.send_keys("harbour")
    submit(d, "text-form")
    wait_text(d, "results-title", r"^Photos for “harbour”, by meaning and words$")
    wait_cards(d, 2)

    # By words: the field's word finds both photos, a word in none of them nothing.
    mode.select_by_visible_text("by words")
    wait_text(d, "results-title", r"^Photos for “harbour”, by words$")
    wait_cards(d, 2)
    assert "text relevance" in cards(d)[0].find_element(By.CLASS_NAME, "score").get_attribute("title")
    query.clear()
    query.send_keys("volcano")
    submit(d, "text-form")
    wait_text(d, "results-title", r"^Photos for “volcano”, by words$")
    wait_text(d, "results-empty", r"No photos found")

    # By meaning: every photo ranks, and a word the caption encoder lacks is named.
    mode.select_by_visible_text("by meaning")
    query.clear()
    query.send_keys("a dog near qqzzx")
    submit(d, "text-form")
    wait_text(d, "results-title", r"^Photos for “a dog near qqzzx”, by meaning$")
    wait_cards(d, 2)
    assert "qqzzx" in wait_text(d, "unknown-words", r"does not know")

    # A photo query has no mode and no unknown words.
    d.find_element(By.ID, "photo").send_keys(PHOTOS[0])
    wait_text(d, "results-title", r"^Photos like ")
    wait_cards(d, 2)
    assert not d.find_element(By.ID, "unknown-words").is_displayed()

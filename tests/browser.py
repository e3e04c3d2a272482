"""A headless Chromium driven by Selenium, for the web UI's tests and the
screenshots in docs/ui.md (Debian's `chromium` and `chromium-driver`).

The flags keep Chromium from reaching outside hosts (updates, sync,
first-run pages) and the profile is a fresh directory, so a run sees only
the broker under test. `Ui` wraps the few steps every test repeats: open
a route, wait for an element, fill and submit one of the UI's forms.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import time

from selenium import webdriver
from selenium.common.exceptions import NoAlertPresentException, StaleElementReferenceException
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

from helpers import unavailable

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage")
WAIT = 15.0  # seconds any UI condition may take on a loaded machine


def require_chromium() -> None:
    """Debian's chromium and chromium-driver, or the test is unavailable (a
    skip; a failure in CI)."""
    if not (shutil.which("chromium") and shutil.which("chromedriver")):
        unavailable("needs Debian's chromium and chromium-driver (tests/prepare.sh installs them)")


def chromium(profile: str, width: int = 1280, height: int = 900) -> webdriver.Chrome:
    os.environ.setdefault("SE_OFFLINE", "true")  # Selenium Manager must not download anything
    options = Options()
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument("--user-data-dir=" + profile)
    options.add_argument("--window-size=%d,%d" % (width, height))
    service = Service(shutil.which("chromedriver") or "/usr/bin/chromedriver")
    return webdriver.Chrome(options=options, service=service)


class Ui:
    """One browser on one broker's management listener."""

    def __init__(self, port: int) -> None:
        self.base = "http://127.0.0.1:%d/" % port
        self.profile = tempfile.mkdtemp(prefix="hutch-chromium-")
        self.driver = chromium(self.profile)

    def close(self) -> None:
        self.driver.quit()
        shutil.rmtree(self.profile, ignore_errors=True)

    def wait(self, predicate, what: str = "condition"):
        """Poll `predicate()` (elements may be replaced while a page refreshes)."""
        deadline = time.monotonic() + WAIT
        while True:
            try:
                value = predicate()
            except StaleElementReferenceException:
                value = None
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError("UI: %s not met within %.0fs on %s" % (what, WAIT, self.driver.current_url))
            time.sleep(0.05)

    def find(self, css: str):
        return self.driver.find_elements(By.CSS_SELECTOR, css)

    def one(self, css: str):
        return self.wait(lambda: (self.find(css) or [None])[0], css)

    def text(self, css: str) -> str:
        return self.one(css).text

    def wait_text(self, css: str, wanted: str):
        return self.wait(lambda: wanted in " ".join(e.text for e in self.find(css)), "%r in %s" % (wanted, css))

    def click_text(self, css: str, text: str) -> None:
        """Click the element matching `css` whose text is `text` (retried
        while the page refreshes under it)."""
        def click():
            for element in self.find(css):
                if element.text == text:
                    element.click()
                    return True
            return False
        self.wait(click, "%r in %s to click" % (text, css))

    def texts(self, css: str) -> list[str]:
        """The texts of the elements matching `css`, read in one go."""
        return self.driver.execute_script(
            "return Array.from(document.querySelectorAll(arguments[0]), e => e.innerText)", css)

    def open(self, route: str) -> None:
        """Open `#/route` (again, when it is open) and wait for its new heading."""
        self.driver.execute_script("""
            const old = document.querySelector('#view h1');
            if (old) old.dataset.old = '1';
            if (location.hash === arguments[0]) window.dispatchEvent(new HashChangeEvent('hashchange'));
            else location.hash = arguments[0];""", "#/" + route)
        self.one("#view[aria-busy=false] h1:not([data-old])")  # the page has loaded: its layout holds still

    def filter(self, text: str, regex: bool = False) -> None:
        """Type into the open list's name filter (replacing what was there)."""
        box = self.one("input[name=filter]")
        if self.one("input[name=regex]").is_selected() != regex:
            self.one("input[name=regex]").click()
        self.driver.execute_script("arguments[0].value = arguments[1];"
                                   "arguments[0].dispatchEvent(new Event('input'))", box, text)

    def login(self, username: str, password: str) -> None:
        self.driver.get(self.base)
        self.driver.execute_script("sessionStorage.clear()")
        self.driver.get(self.base)
        self.one("#login-form input[name=username]").send_keys(username)
        self.one("#login-form input[name=password]").send_keys(password)
        self.one("#login-form button").click()

    def logout(self) -> None:
        self.one("#logout").click()
        self.wait(lambda: self.one("#login").is_displayed(), "login form shown")

    def confirmation(self, accept: bool = True) -> str:
        """The text of the confirmation dialog the page opened, answered
        yes (`accept`) or no."""
        alert = self.wait(lambda: self._alert(), "a confirmation dialog")
        text = alert.text
        if accept:
            alert.accept()
        else:
            alert.dismiss()
        return text

    def _alert(self):
        try:
            return self.driver.switch_to.alert
        except NoAlertPresentException:
            return None

    def submit(self, form_id: str, fields: dict | None = None, leaves: bool = False, refused: bool = False,
               confirm: str | None = None) -> str:
        """Fill the form's fields (text, selects, checkboxes), submit it and
        return the note it shows (raises on an error note, or when `refused`
        on any other); a form that `leaves` the page on success (a delete) is
        only submitted. A destructive form asks first: `confirm` is the
        question expected, answered yes."""
        form = self.one("form#" + form_id)
        for name, value in (fields or {}).items():
            field = form.find_element(By.NAME, name)
            if field.tag_name == "select":
                self.driver.execute_script("arguments[0].value = arguments[1]", field, value)
            elif field.get_attribute("type") == "checkbox":
                if field.is_selected() != bool(value):
                    field.click()
            else:
                field.clear()
                field.send_keys(value)
        note = form.find_element(By.CSS_SELECTOR, ".note")
        self.driver.execute_script("arguments[0].textContent = ''; performance.clearResourceTimings()", note)
        form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
        if confirm is not None:
            asked = self.confirmation()
            if asked != confirm:
                raise AssertionError("form %s asked %r, not %r" % (form_id, asked, confirm))
        if leaves:
            return ""
        try:
            text = self.wait(lambda: note.text, "an answer to form " + form_id)
        except AssertionError as exc:
            raise AssertionError("%s (%s)" % (exc, self._state(note))) from None
        if ("error" in note.get_attribute("class")) != refused:
            raise AssertionError("form %s: %s" % (form_id, text))
        return text

    def _state(self, note) -> str:
        """What the page shows about a form that gave no answer: whether its
        note is still in the page, the view's heading and load state, and the
        requests the page finished since the form was submitted (name and
        milliseconds taken)."""
        script = """
            const view = document.getElementById('view'), h1 = view.querySelector('h1');
            return {note_in_page: !!arguments[0], heading: h1 && h1.innerText, busy: view.getAttribute('aria-busy'),
                    requests: performance.getEntriesByType('resource')
                      .map((e) => e.name.replace(location.origin, '') + ' ' + Math.round(e.duration))};"""
        try:
            return repr(self.driver.execute_script(script, note))
        except StaleElementReferenceException:  # the page was drawn again: the note is gone
            return repr(self.driver.execute_script(script, None))

    def screenshot(self, path: str) -> None:
        self.driver.save_screenshot(path)

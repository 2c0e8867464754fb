"""The dashboard in a real browser: Debian's Chromium, headless, driven by Selenium.

The real ``jobqueue dashboard`` and a real ``jobqueue worker`` run in subprocesses on the test's
database. A job fails, the browser finds it, reads its traceback and retries it; the worker then
completes it and the browser sees that. Nothing is downloaded: the driver and the browser are the
Debian packages that scripts/test.sh installs, named explicitly so Selenium Manager never runs.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from jobqueue import JobQueue
from jobqueue.clock import utcnow
from jobqueue.storage import jobs
from tests.acceptance.cli import ROOT
from tests.apps import basic
from tests.dashboard.process import DashboardProcess
from tests.runtime.harness import Worker, wait_for
from tests.storage.test_history import archive

CHROMEDRIVER = "/usr/bin/chromedriver"
CHROMIUM = "/usr/bin/chromium"
SCREENSHOT = ROOT / "docs" / "images" / "dashboard.png"
SCREENSHOT_BACKEND = "postgresql"  # its masked URL shows in the header, password and all
TOKEN = "browser-test-token-0123456789"


@pytest.fixture(scope="module")
def browser() -> Iterator[webdriver.Chrome]:
    for path in (CHROMEDRIVER, CHROMIUM):
        if not os.path.exists(path):
            raise RuntimeError(f"{path} is missing: run scripts/test.sh, which installs chromium and chromium-driver")
    os.environ["SE_AVOID_STATS"] = "true"  # Selenium reports nothing anywhere
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,960"):
        options.add_argument(argument)
    # A driver path of our own: Selenium Manager (which would look for, or fetch, a driver) never runs.
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.implicitly_wait(5)  # a find waits for the page a click loads
    yield driver
    driver.quit()


@pytest.fixture
def basic_app(db_url: str) -> Iterator[JobQueue]:
    """tests/apps/basic.py, the app of the worker and the dashboard, pointed at this test's database."""
    basic.app.configure(database_url=db_url)
    yield basic.app
    basic.app.close()


def state_shown(driver: webdriver.Chrome) -> str:
    return str(driver.find_element(By.ID, "state").text)


def open_page(driver: webdriver.Chrome, link: str, title: str) -> None:
    """Click a link and wait for the page it leads to (a find alone could still see the old one)."""
    driver.find_element(By.LINK_TEXT, link).click()
    WebDriverWait(driver, 10).until(lambda d: d.title == f"{title} · jobqueue")


def test_find_a_failed_job_read_its_traceback_retry_it_and_see_it_complete(
    basic_app: JobQueue, backend: str, browser: webdriver.Chrome, tmp_path: Path
) -> None:
    job = basic.fail_once.delay(str(tmp_path / "marker"))  # fails while the marker file is missing
    worker = Worker(tmp_path, "--concurrency", "2", "--release-stuck-timeout", "3", app="tests.apps.basic:app")
    try:
        wait_for(lambda: job.status() == "failed", 30, "the job to fail")
        with DashboardProcess(tmp_path, "--token", TOKEN) as dashboard:
            browser.delete_all_cookies()
            browser.get(dashboard.url + f"?token={TOKEN}")  # the first visit; a cookie carries it on
            assert "token" not in browser.current_url and browser.title == "Overview · jobqueue"

            open_page(browser, "Failed jobs", "Failed jobs")
            row = browser.find_element(By.CSS_SELECTOR, f'tr[data-job="{job.id}"]')
            assert "RuntimeError: first run fails" in row.text
            row.find_element(By.LINK_TEXT, str(job.id)).click()
            WebDriverWait(browser, 10).until(lambda d: d.title == f"Job {job.id} · jobqueue")
            assert state_shown(browser) == "failed"
            traceback = browser.find_element(By.ID, "traceback").text
            assert traceback.startswith("Traceback (most recent call last):")
            assert 'raise RuntimeError("first run fails")' in traceback

            browser.find_element(By.ID, "retry").click()
            flash = browser.find_element(By.CSS_SELECTOR, ".flash.ok").text
            assert flash == f"job {job.id} is back in its queue, attempts reset"
            assert job.status() != "failed"

            def completed(driver: webdriver.Chrome) -> bool:
                driver.refresh()  # the page came from a redirect after the POST: a plain GET again
                return state_shown(driver) == "completed"

            WebDriverWait(browser, 30, poll_frequency=0.3).until(completed)
            assert "second run works" in browser.find_element(By.ID, "result").text
            assert "first run fails" in browser.find_element(By.CSS_SELECTOR, "ol.history").text

            open_page(browser, "Failed jobs", "Failed jobs")
            assert not browser.find_elements(By.CSS_SELECTOR, f'tr[data-job="{job.id}"]')
            if backend == SCREENSHOT_BACKEND:
                busy_overview(basic_app, browser, dashboard.url, tmp_path)
            assert TOKEN not in dashboard.text()
    finally:
        worker.close()


def synthetic_hour(app: JobQueue) -> int:
    """Archive rows of jobs that finished over the last 45 minutes (a worker would take that long to
    write them); returns how many completed."""
    now = utcnow()
    rows: list[tuple[str, datetime, datetime | None]] = []
    for minutes_ago in range(1, 46):
        finished = now - timedelta(minutes=minutes_ago)
        rows += [("COMPLETED", finished, None)] * (12 + (minutes_ago * 7) % 17)
        rows += [("FAILED", finished, None)] * (minutes_ago % 11 == 3)
    archive(app, rows, first_id=10**9)  # far above the ids of real jobs
    return sum(state == "COMPLETED" for state, _, _ in rows)


def busy_overview(app: JobQueue, browser: webdriver.Chrome, url: str, tmp_path: Path) -> None:
    """Give the overview something to show, check it, and save it as the documentation's picture."""
    earlier = synthetic_hour(app)
    basic.add.bulk([(i, i) for i in range(40)])
    for reason in ("card declined", "address not found"):
        basic.fail.delay(reason)
    for queue, count in (("reports", 3), ("emails", 5)):
        for i in range(count):
            basic.add.apply_async((i, i), queue=queue, countdown=600 + 60 * i)
    sleeper = basic.sleep.delay(30)
    wait_for(
        lambda: any(
            w.get("running_job_id") == sleeper.id for w in jobs.worker_rows(app.store, app.settings.worker_stale_after)
        ),
        15,
        "a heartbeat",
    )
    wait_for(lambda: jobs.archive_counts(app.store).get("completed", 0) >= 41, 15, "the additions to complete")
    browser.get(url)
    workers = browser.find_element(By.ID, "workers").text
    assert f"job {sleeper.id}" in workers and "idle" in workers
    assert f"{earlier + 41} completed" in browser.find_element(By.ID, "throughput").text
    queues = browser.find_element(By.ID, "queues").text
    assert "reports" in queues and "emails" in queues
    taken = tmp_path / "dashboard.png"
    assert browser.save_screenshot(str(taken))
    if os.environ.get("JOBQUEUE_UPDATE_SCREENSHOTS") or not SCREENSHOT.exists():
        shutil.copyfile(taken, SCREENSHOT)

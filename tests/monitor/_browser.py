"""Headless Chromium (Debian's ``chromium`` + ``chromium-driver``) through selenium.

Missing browser or driver fails the test with the package to install (never a skip).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

from selenium import webdriver
from selenium.webdriver.chrome.service import Service

CHROMIUM = "/usr/bin/chromium"
DRIVER = "/usr/bin/chromedriver"
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-dev-shm-usage",
    "--window-size=1280,1000",
)


@contextmanager
def chromium() -> Iterator[webdriver.Chrome]:
    for path, package in ((CHROMIUM, "chromium"), (DRIVER, "chromium-driver")):
        if shutil.which(path) is None:
            raise AssertionError(f"{path} is missing: apt-get install {package}")
    profile = tempfile.mkdtemp(prefix="pymetaq-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)

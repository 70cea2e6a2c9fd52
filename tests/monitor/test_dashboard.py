"""The dashboard in a real browser (headless Chromium) against a live broker under load.

A producer and a reader keep the ``load`` topic busy the whole time; the ``lagt`` topic holds
messages the test put itself and a raw MetaQ group stopped part-way, so every number the pages
show for it is known exactly.  Each page is loaded and its numbers checked, the live ones are
seen to move (the page's script polls the JSON), the reload button is clicked, and the guard of
that POST is tried without the page's token and from another origin.
"""

from __future__ import annotations

import random
import re
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from selenium.webdriver.common.by import By

from tests._broker import BrokerProcess
from tests._helpers import free_port, wait_for
from tests.monitor._browser import chromium
from tests.monitor._helpers import Ledger, Producer, RawGroup, fill

pytestmark = pytest.mark.integration

TOPICS: dict[str, dict[str, object]] = {
    "lagt": {"numPartitions": 2, "stat": "true"},
    "load": {"numPartitions": 2},
}
EVIL = "<i>evil</i>&\"'"


class Reader(threading.Thread):
    """A raw group following the ``load`` topic until stopped."""

    def __init__(self, address: tuple[str, int]) -> None:
        super().__init__(daemon=True, name="reader")
        self.group = RawGroup(address, "follower")
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            for p in (0, 1):
                self.group.fetch("load", p, 8192)
            self.stopping.wait(0.02)

    def stop(self) -> None:
        self.stopping.set()
        self.join(30)
        self.group.close()


def value(driver, css: str) -> float:  # type: ignore[no-untyped-def]
    return float(driver.find_element(By.CSS_SELECTOR, css).get_attribute("data-value"))


def test_pages_show_the_truth_under_load(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    with BrokerProcess.start(
        tmp_path, topics=TOPICS, system={"dashboardHttpPort": free_port()}
    ) as broker:
        ledger = Ledger()
        fill(broker.address, ledger, "lagt", 2, 200, rng)
        slow, evil = RawGroup(broker.address, "slow"), RawGroup(broker.address, EVIL)
        for partition, fetches in ((0, 3), (1, 1)):
            for _ in range(fetches):
                slow.fetch("lagt", partition, 700)
        evil.fetch("lagt", 0, 100)
        producer = Producer(broker.address, Ledger(), "load", 2, seed)
        reader = Reader(broker.address)
        producer.start()
        reader.start()
        try:
            with chromium() as driver:
                base = broker.http_url
                _overview(driver, base)
                _topics(driver, base, ledger)
                _groups(driver, base, ledger, slow, tmp_path)
                _config(driver, base, broker)
        finally:
            producer.stop()
            reader.stop()
            slow.close()
            evil.close()


def _overview(driver, base: str) -> None:  # type: ignore[no-untyped-def]
    driver.get(base)
    assert driver.title == "Overview · pymetaq broker 0"
    assert value(driver, '.tile .value[data-key="partitions"]') == 4
    assert value(driver, '.tile .value[data-key="connections"]') >= 4
    # the script polls /api/overview: the rate tile moves off zero under load
    wait_for(
        lambda: value(driver, '.tile .value[data-key="rates.messages"]') > 0,
        30,
        "a non-zero messages/s tile",
    )
    assert driver.find_element(By.ID, "updated").text.startswith("updated ")


def _topics(driver, base: str, ledger: Ledger) -> None:  # type: ignore[no-untyped-def]
    driver.get(base + "topics")
    cells = driver.find_elements(By.CSS_SELECTOR, 'table.topics tr[data-topic="lagt"] td')
    assert [c.get_attribute("data-value") for c in cells[1:4]] == [
        "2", "200", str(ledger.end("lagt", 0) + ledger.end("lagt", 1)),
    ]  # fmt: skip
    load_rate = 'table.topics tr[data-topic="load"] td:nth-child(5)'
    wait_for(lambda: value(driver, load_rate) > 0, 30, "a non-zero msgs/s for the load topic")
    driver.find_element(By.LINK_TEXT, "lagt").click()
    wait_for(lambda: driver.title.startswith("Topic lagt"), 30, "the topic page")
    for p in (0, 1):
        row = f'table.partitions tr[data-partition="{p}"] td'
        assert value(driver, row + ":nth-child(3)") == ledger.end("lagt", p)
        assert value(driver, row + ":nth-child(4)") == ledger.count("lagt", p)
    links = driver.find_elements(By.CSS_SELECTOR, 'a[href^="/groups#"]')
    assert {a.text for a in links} == {"slow", EVIL}


def _groups(driver, base: str, ledger: Ledger, slow: RawGroup, tmp: Path) -> None:  # type: ignore[no-untyped-def]
    driver.get(base + "groups")
    total = 0
    for p in (0, 1):
        row = f'section.group[data-group="slow"] tr[data-key="lagt/{p}"]'
        position, end = slow.last_get[("lagt", p)], ledger.end("lagt", p)
        assert value(driver, row + " .fetch_offset") == position
        assert value(driver, row + " .max_offset") == end
        assert value(driver, row + " .lag_bytes") == end - position
        total += end - position
    assert value(driver, 'section.group[data-group="slow"] .group-lag') == total
    # a hostile group name is shown as text, never as markup
    names = [
        h.text.split("\n")[0] for h in driver.find_elements(By.CSS_SELECTOR, "section.group h2")
    ]
    assert EVIL in names and not driver.find_elements(By.CSS_SELECTOR, "section.group h2 i")
    # live: the follower's position moves and its chart gets drawn
    cell = 'section.group[data-group="follower"] tr[data-key="load/0"] .fetch_offset'
    first = value(driver, cell)
    wait_for(lambda: value(driver, cell) > first, 30, "the follower's fetch offset to move")
    painted = (
        "const c = document.querySelector('section.group[data-group=\"follower\"] canvas');"
        "const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;"
        "let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i]) n++; return n;"
    )
    wait_for(lambda: driver.execute_script(painted) > 1000, 30, "the lag chart to be drawn")
    shot = tmp / "groups.png"
    assert driver.save_screenshot(str(shot)) and shot.stat().st_size > 10_000


def _config(driver, base: str, broker: BrokerProcess) -> None:  # type: ignore[no-untyped-def]
    driver.get(base + "config")
    assert "[topic=lagt]" in driver.find_element(By.CSS_SELECTOR, "pre.config").text
    broker.config_path.write_text(broker.config_path.read_text() + "\n[topic=added]\n")
    driver.find_element(By.ID, "reload").click()
    wait_for(lambda: driver.find_elements(By.CSS_SELECTOR, "p.flash"), 30, "the reload result")
    flash = driver.find_element(By.CSS_SELECTOR, "p.flash").text
    assert flash.startswith("Reloaded: config reloaded: 3 topic section(s)"), flash
    assert driver.current_url == base + "config"
    assert "[topic=added]" in driver.find_element(By.CSS_SELECTOR, "pre.config").text


def _post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, str]:
    req = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=30) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_reload_is_guarded(tmp_path: Path) -> None:
    with BrokerProcess.start(tmp_path, system={"dashboardHttpPort": free_port()}) as broker:
        url = broker.http_url
        form = {"Content-Type": "application/x-www-form-urlencoded"}
        assert _post(url + "reload-config", b"", form) == (
            403, "missing or wrong CSRF token: use the button on /config\n",
        )  # fmt: skip
        with urllib.request.urlopen(url + "config", timeout=30) as reply:
            page = reply.read().decode()
        match = re.search(r'name="token" value="([^"]+)"', page)
        assert match is not None
        token = b"token=" + match.group(1).encode()
        evil = {**form, "Origin": "http://evil.example"}
        assert _post(url + "reload-config", token, evil) == (
            403, "cross-origin request refused (Origin: http://evil.example)\n",
        )  # fmt: skip
        cross = {**form, "Sec-Fetch-Site": "cross-site"}
        assert _post(url + "reload-config", token, cross)[0] == 403
        assert "reloaded" not in broker.log_text()
        status, _ = _post(url + "reload-config", token, form)  # urllib follows the 303
        assert status == 200 and "config reloaded: 1 topic section(s)" in broker.log_text()
        try:
            urllib.request.urlopen(url + "stats/reset", timeout=30)
            raise AssertionError("GET /stats/reset answered")
        except urllib.error.HTTPError as exc:
            assert exc.code == 403

"""The console in a real browser: Debian's chromium driven by Playwright, against the embedded broker, a real
worker process and a real console process.

Skipped only when /usr/bin/chromium is absent (``.ci/install_chromium.sh`` installs it in CI). Screenshots of the
main pages go to ``$CONSOLE_SCREENSHOTS_DIR`` (default: the test's tmp dir); docs/console/*.png are copies.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from kafka_utils import DEADLINE, Topics, WorkerProcess, producer, read_topic, send_json, wait_for

from streamsemi.core import datasets
from streamsemi.service.config import SETTINGS

CHROMIUM = "/usr/bin/chromium"
if not os.path.exists(CHROMIUM):
    pytest.skip("Debian's chromium is not installed at /usr/bin/chromium (.ci/install_chromium.sh installs it)",
                allow_module_level=True)

from playwright.sync_api import Page, sync_playwright  # noqa: E402

pytestmark = pytest.mark.slow

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
XSS_TEXT = ('<script>window.__pwned = 1;</script><img src="x" onerror="window.__pwned = 2"> '
            "wheat grain harvest exports tonnes")
WITHHELD = ("ship", "grain")  # classes nobody seeds: the models may discover them as new clusters
SEEDS_PER_CLASS = 5


def _topic_flags(topics: Topics) -> list[str]:
    """The worker's and the console's topic flags, including the clusters/suggestions topics where they exist."""
    known = {s.name for s in SETTINGS}
    out = list(topics.flags())
    for name in ("suggestions_topic", "clusters_topic"):
        flag = "--" + name.replace("_", "-")
        if name in known and flag not in out:
            out += [flag, f"{topics.prefix}.{name.split('_')[0]}"]
    return out


class ConsoleProcess:
    def __init__(self, bootstrap: str, flags: list[str], worker_url: str, log_dir: Path) -> None:
        self.cmd = [sys.executable, "-m", "streamsemi", "console", "--bootstrap-servers", bootstrap, "--port", "0",
                    "--worker-url", worker_url, *flags]
        self.err = open(log_dir / "console.err", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=self.err)
        self.url = self._started()

    def _started(self, timeout: float = DEADLINE) -> str:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        assert ready, "the console printed its address"
        line = json.loads(self.proc.stdout.readline())
        assert line["event"] == "console_started" and line["auth"] is False
        return line["url"].rstrip("/")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(DEADLINE)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.err.close()
        return self.proc.returncode


def _refits(worker: WorkerProcess) -> list[dict]:
    """The worker's refit_done events (one per algorithm and round), oldest first."""
    return [e for e in worker.logs() if e.get("event") == "refit_done"]


def _control(bootstrap: str, topic: str) -> list[dict]:
    return [json.loads(r.value) for r in read_topic(bootstrap, topic, idle=1.5) if r.value]


def _reload_until(page: Page, url: str, selector: str, timeout: float = DEADLINE) -> None:
    def shown() -> bool:
        page.goto(url)
        return page.locator(selector).count() > 0

    wait_for(shown, timeout, f"{selector} on {url}", 1.0)


def _not_pwned(page: Page) -> None:
    assert page.evaluate("typeof window.__pwned") == "undefined", f"a document's markup ran as script on {page.url}"


def test_console_in_chromium_label_undo_name_and_escaping(broker, tmp_path):
    shots = Path(os.environ.get("CONSOLE_SCREENSHOTS_DIR") or tmp_path / "screenshots")
    shots.mkdir(parents=True, exist_ok=True)
    topics = Topics()
    topics.create(broker.bootstrap)
    flags = _topic_flags(topics)
    worker_args = ["--algorithms", "constrained-kmeans", "--refit-every-docs", "0", "--min-docs-first-refit", "200",
                   "--refit-growth", "0", "--n-new-clusters", "2", "--first-fit-stable-seeds", "0", *flags]
    worker = WorkerProcess(broker.bootstrap, topics, worker_args, log_dir=tmp_path).start()
    console = None
    ds = datasets.load("reuters-r8")
    try:
        assert worker.wait_assigned(), "the worker joined its group"
        console = ConsoleProcess(broker.bootstrap, flags, f"http://127.0.0.1:{worker.metrics_port}", tmp_path)
        p = producer(broker.bootstrap)
        per_class: dict[str, int] = {}
        n_seeds = 0
        seeded: dict[str, str] = {}
        for k in range(400):
            doc_id = f"r8:{k}"
            # as `streamsemi produce` sends them: the corpus as stream (this worker runs no per-stream models)
            send_json(p, topics.documents, {"id": doc_id, "text": ds.texts[k], "stream": "reuters-r8"}, key=doc_id)
            label = ds.labels[k]
            if label not in WITHHELD and per_class.get(label, 0) < SEEDS_PER_CLASS:
                per_class[label] = per_class.get(label, 0) + 1
                send_json(p, topics.control, {"op": "label", "id": doc_id, "labels": [label]}, key=doc_id)
                seeded[doc_id] = label
                n_seeds += 1
            if k == 50:
                send_json(p, topics.documents, {"id": "xss-1", "text": XSS_TEXT}, key="xss-1")
        p.flush()

        with sync_playwright() as pw:
            ctx = pw.chromium.launch_persistent_context(
                str(tmp_path / "chromium-profile"), executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS,
                viewport={"width": 1280, "height": 900})
            ctx.set_default_timeout(DEADLINE * 1000)  # playwright's 30 s: a loaded machine renders slower
            try:
                page = ctx.new_page()
                base = console.url
                # the queue fills after the worker's first refit: from the worker's suggestions topic where
                # this streamsemi has one (until it is read, the console ranks the labels it has read itself)
                source = "suggestions" if any(f == "--suggestions-topic" for f in flags) else "labels"
                _reload_until(page, base + "/queue", f'#queue[data-source="{source}"] li.suggestion')
                page.screenshot(path=str(shots / "queue.png"))
                _not_pwned(page)
                first = page.locator("#queue li.suggestion").first
                doc_id = first.get_attribute("data-id")
                label = first.locator('form:has(button[data-key="1"]) input[name="label"]').get_attribute("value")
                version_before = max(e["version"] for e in _refits(worker))
                # label with one click
                first.locator('button[data-key="1"]').click()
                page.wait_for_selector("#flash")
                assert page.inner_text("#flash").startswith(f"labelled {doc_id} as {label}")
                assert page.locator(f'#queue li.suggestion[data-id="{doc_id}"]').count() == 0
                # the keyboard: "s" skips the highlighted suggestion
                current = page.locator("#queue li.suggestion.current")
                if current.count():
                    skipped = current.get_attribute("data-id")
                    page.keyboard.press("s")
                    page.wait_for_url("**/queue?msg=skipped*")
                    assert page.locator(f'#queue li.suggestion[data-id="{skipped}"]').count() == 0
                wait_for(lambda: any(m["op"] == "label" and m["id"] == doc_id and m["labels"] == [label]
                                     for m in _control(broker.bootstrap, topics.control)), DEADLINE,
                         "the control topic carries the console's label", 1.0)
                # the next model has that seed
                page.goto(base + "/")
                page.click("#refit")
                assert "refit requested" in page.inner_text("#flash")
                wait_for(lambda: any(e["version"] > version_before and e["seeds"] == n_seeds + 1
                                     for e in _refits(worker)), DEADLINE, f"a model with the {n_seeds + 1} seeds",
                         logs=[worker.log_path])
                # undo it from the seeds page
                _reload_until(page, base + "/seeds", f'#seeds tr[data-id="{doc_id}"]')
                page.screenshot(path=str(shots / "seeds.png"))
                version_labelled = max(e["version"] for e in _refits(worker))
                page.locator(f'#seeds tr[data-id="{doc_id}"] button.undo').click()
                assert page.inner_text("#flash").startswith(f"removed the seed of {doc_id}")
                wait_for(lambda: any(m["op"] == "unlabel" and m["id"] == doc_id
                                     for m in _control(broker.bootstrap, topics.control)), DEADLINE,
                         "the unlabel op on the control topic", 1.0)
                page.goto(base + "/")
                page.click("#refit")
                wait_for(lambda: any(e["version"] > version_labelled and e["seeds"] == n_seeds
                                     for e in _refits(worker)), DEADLINE, "the next model no longer has it",
                         logs=[worker.log_path])
                # the keyboard: "n" opens "new class..." on the highlighted suggestion, Enter sends it
                page.goto(base + "/queue")
                current = page.locator("#queue li.suggestion.current")
                new_id = current.get_attribute("data-id")
                page.keyboard.press("n")
                assert page.evaluate("document.activeElement.name") == "new_label"
                page.keyboard.type("Widgets")
                page.keyboard.press("Enter")
                page.wait_for_url("**/queue?msg=labelled*")
                assert page.inner_text("#flash").startswith(f"labelled {new_id} as Widgets")
                wait_for(lambda: any(m["op"] == "label" and m["id"] == new_id and m["labels"] == ["Widgets"]
                                     for m in _control(broker.bootstrap, topics.control)), DEADLINE,
                         "the new class's label on the control topic", 1.0)
                # name a discovered cluster
                _reload_until(page, base + "/clusters/new", "section.newcluster")
                page.screenshot(path=str(shots / "new_clusters.png"))
                section = page.locator("section.newcluster").first
                cluster, algorithm = section.get_attribute("data-cluster"), section.get_attribute("data-algorithm")
                section.locator('input[name="label"]').fill("shipping")
                section.locator("button[type=submit]").click()
                flash = page.inner_text("#flash")
                assert flash.startswith(f"named {cluster} shipping"), flash
                wait_for(lambda: [m for m in _control(broker.bootstrap, topics.control)
                                  if m["op"] == "name" and m["cluster"] == cluster
                                  and m.get("algorithm") == algorithm and m["label"] == "shipping"], DEADLINE,
                         "the control topic carries the name op", 1.0)
                # a named cluster is a class now: it leaves New clusters (and Clusters shows it named, or merged)
                named = f'section.newcluster[data-cluster="{cluster}"][data-algorithm="{algorithm}"]'

                def gone_from_new_clusters() -> bool:
                    page.goto(base + "/clusters/new")
                    return page.locator(named).count() == 0

                wait_for(gone_from_new_clusters, DEADLINE, f"{cluster} off New clusters once named", 1.0)
                page.goto(base + "/clusters")
                row = page.locator(f'section[data-algorithm="{algorithm}"] tr[data-cluster="{cluster}"]')
                assert row.count() == 0 or "named shipping" in row.inner_text(), "named, or merged into the class"
                # the document page of a seed: its seed, one button per class, unlabel; no stream in its forms
                seed_id, seed_label = next(iter(seeded.items()))
                other = next(c for c in sorted(set(seeded.values())) if c != seed_label)
                page.goto(base + "/doc?id=" + seed_id)
                assert page.inner_text("#seed-labels") == seed_label
                buttons = page.locator("#doc-actions button.cls").all_inner_texts()
                assert set(seeded.values()) <= set(buttons), buttons
                assert page.locator('#doc-actions input[name="stream"]').count() == 0
                assert page.locator('#doc-actions input[name="new_label"]').count() == 1
                page.screenshot(path=str(shots / "document_seed.png"))
                page.locator(f'#doc-actions button.cls[data-class="{other}"]').click()
                page.wait_for_selector("#flash")
                assert page.inner_text("#flash").startswith(f"labelled {seed_id} as {other}")
                wait_for(lambda: any(m["op"] == "label" and m["id"] == seed_id and m["labels"] == [other]
                                     and "stream" not in m for m in _control(broker.bootstrap, topics.control)),
                         DEADLINE, "the class button's label on the control topic", 1.0)

                def seed_shown(label: str = other) -> bool:
                    page.goto(base + "/doc?id=" + seed_id)
                    return page.inner_text("#seed-labels") == label

                wait_for(seed_shown, DEADLINE, "the document page shows the new seed", 1.0)
                page.click("#unlabel")
                assert page.inner_text("#flash").startswith(f"removed the seed of {seed_id}")
                wait_for(lambda: [m for m in _control(broker.bootstrap, topics.control) if m["op"] == "unlabel"
                                  and m["id"] == seed_id] == [{"op": "unlabel", "id": seed_id}], DEADLINE,
                         "the unlabel button's op on the control topic", 1.0)
                # a <script> document shows as text and runs nothing, on every page that shows it
                page.goto(base + "/doc?id=xss-1")
                assert XSS_TEXT in page.inner_text("#doc-text")
                _not_pwned(page)
                page.screenshot(path=str(shots / "document.png"))
                for name, path in (("overview", "/"), ("clusters", "/clusters"), ("queue", "/queue")):
                    page.goto(base + path)
                    _not_pwned(page)
                    if name == "overview":   # the suggestion labelled above is judged apart, as a queue seed
                        col = page.locator("#quality thead th").all_inner_texts().index("accuracy on queue seeds")

                        def queue_accuracy(col: int = col) -> str:
                            page.reload()
                            return page.locator("#quality tbody tr").first.locator("td").all_inner_texts()[col]

                        wait_for(lambda: queue_accuracy() != "–", DEADLINE, "the accuracy on queue seeds", 1.0)
                        assert 0.0 <= float(queue_accuracy()) <= 1.0
                    if name != "queue":
                        page.screenshot(path=str(shots / f"{name}.png"), full_page=name == "overview")
                assert page.locator("#queue li.suggestion").count() > 0
            finally:
                ctx.close()
        assert console.proc.poll() is None and worker.proc.poll() is None
    finally:
        console_rc = console.stop() if console is not None else 0
        worker_rc = worker.terminate()  # stopped whatever the console did
    assert console_rc == 0 and worker_rc == 0, "SIGTERM: both exit cleanly"
    print(f"console screenshots: {shots}")

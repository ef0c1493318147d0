"""`envspec db show --html FILE`: one self-contained page, the GPU x torch x CUDA-variant matrix with
driver floors, filterable, each cell linked to its source. Rendered by a real browser (Debian's
chromium, headless) and read back from its DOM; skipped, saying so, where chromium is absent."""

from __future__ import annotations

import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from envspec import explain
from envspec.cli import main
from envspec.compat import load_db

DB = load_db()
H100 = next(g["id"] for g in explain.db_matrix(DB)["gpus"] if g["short"] == "H100")
B200 = next(g["id"] for g in explain.db_matrix(DB)["gpus"] if g["short"] == "B200")
ROW = "b-2_14_1-cu130"  # torch 2.14.1 cu130: compat floor 580.65.06 (CUDA 13.x), H100 runs sm_90


class Cells(HTMLParser):
    """Every <td> of the matrix by (row id, data-gpu): its classes and attributes; and every src/href."""

    def __init__(self) -> None:
        super().__init__()
        self.row = ""
        self.cells: dict[tuple[str, str], dict[str, str]] = {}
        self.links: list[str] = []
        self.srcs: list[str] = []
        self.ids: set[str] = set()
        self.rows: dict[str, dict[str, str]] = {}

    def handle_starttag(self, tag, attrs):
        a = {k: v or "" for k, v in attrs}
        if "id" in a:
            self.ids.add(a["id"])
        if tag == "tr":
            self.row = a.get("id", "")
            self.rows[self.row] = a
        if tag == "td" and "data-gpu" in a:
            self.cells[(self.row, a["data-gpu"])] = a
        if "src" in a or tag in ("link", "img", "iframe"):
            self.srcs.append(f"{tag} {a}")
        if tag == "a":
            self.links.append(a.get("href", ""))


def _parse(text: str) -> Cells:
    p = Cells()
    p.feed(text)
    return p


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("html") / "db.html"
    assert main(["db", "show", "--html", str(out)]) == 0
    return out


def test_the_page_is_self_contained_and_deterministic(page: Path):
    text = page.read_text()
    p = _parse(text)
    assert p.srcs == [], "no external assets: nothing loaded by src, no <link>"
    assert not re.search(r"@import|url\(", text)
    assert text == explain.db_html(DB), "a function of the DB alone"
    # every in-page link lands on an element of the page; the rest are the sources' own addresses
    for href in p.links:
        assert (
            href.startswith("#") and href[1:] in p.ids or href.startswith(("https://", "http://"))
        ), href


def test_a_known_cell_says_its_floor_and_links_to_its_source(page: Path):
    p = _parse(page.read_text())
    cell = p.cells[(ROW, H100)]
    assert "runs" in cell["class"].split() and cell["data-floor"] == "580.65.06"
    assert "sm_90" in cell["title"]
    gh = p.cells[("b-2_3_1-cu118", H100)]  # cu118 loads on 450.80.02 under compat; H100 needs R520
    assert gh["data-floor"] == "520"
    text = page.read_text()
    src = re.search(rf'<li id="src-{ROW}">(.*?)</li>\n', text, re.S).group(1)
    assert (
        "CUDA 13.0" in src and "cuDNN 9.24.0.43" in src and "https://docs.nvidia.com/cuda/" in src
    )


def _chromium() -> str:
    for name in ("chromium", "chromium-browser"):
        if shutil.which(name):
            return shutil.which(name) or name
    pytest.skip(
        "chromium is not installed (apt-get install chromium): the page is not checked in a browser"
    )


def _dom(page: Path, query: str) -> Cells:
    proc = subprocess.run(
        [
            _chromium(),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--user-data-dir=" + str(page.parent / "profile"),
            "--dump-dom",
            page.as_uri() + query,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return _parse(proc.stdout)


def test_in_a_browser_the_filters_mark_a_known_cell(page: Path):
    dom = _dom(page, "?gpu=H100&driver=535.104.05")
    cell = dom.cells[(ROW, H100)]
    classes = cell["class"].split()
    assert "too-old" in classes and "hidden" not in classes, cell  # 535 < 580.65.06
    assert (
        "hidden" in dom.cells[(ROW, B200)]["class"].split()
    )  # another GPU's column is filtered out
    assert "too-old" not in dom.cells[("b-2_3_1-cu118", H100)]["class"].split()  # 535 >= R520
    dom = _dom(page, "?gpu=H100&driver=580.95.05")
    assert "too-old" not in dom.cells[(ROW, H100)]["class"].split()
    dom = _dom(
        page, "?driver=470.82.01"
    )  # all GPUs shown; R470 drives no Hopper, whatever the CUDA
    assert "too-old" in dom.cells[("b-2_3_1-cu118", H100)]["class"].split()
    assert "hidden" not in dom.cells[(ROW, B200)]["class"].split()


def test_the_page_has_a_legend_for_each_kind_of_cell(page: Path):
    """issue 42, 5: read as a newcomer, the page said nowhere what green, yellow, red and (PyPI) mean."""
    text = page.read_text()
    legend = text[
        text.index('<ul id="legend">') : text.index("</ul>", text.index('<ul id="legend">'))
    ]
    for kind in ("runs", "too-old", "none"):
        assert f'class="swatch {kind}"' in legend and f"td.{kind}, .swatch.{kind}" in text
    assert "(PyPI)" in legend and "no kernel image is available" in legend


def test_only_the_builds_that_run_on_the_chosen_gpu_and_driver(page: Path):
    """issue 29, 4 (its switch): with "only the builds that run there" ticked, a build none of whose
    shown cells runs on the driver is hidden, one that runs stays."""
    dom = _dom(page, "?gpu=H100&driver=535.104.05&only=1")
    hidden = {r for r, a in dom.rows.items() if r and "hidden" in a.get("class", "").split()}
    assert ROW in hidden  # 2.14.1 cu130 needs 580.65.06 on an H100
    assert "b-2_3_1-cu118" not in hidden  # runs from R520 on
    dom = _dom(page, "?gpu=H100&driver=535.104.05")  # not ticked: every row shown
    assert not any("hidden" in a.get("class", "").split() for a in dom.rows.values())


def test_a_driver_past_a_gpus_last_branch_marks_its_cells_and_the_switch_hides_its_column(
    page: Path,
):
    """issue 29, 2 and 4: a V100 is driven by no branch after R580, so on driver 590 none of its cells
    runs, whatever the build; "only what runs there" then hides its column, and a product line
    shows its GPUs only."""
    gpus = explain.db_matrix(DB)["gpus"]
    v100 = next(g["id"] for g in gpus if g["short"] == "V100")
    row = "b-2_3_1-cu118"  # has sm_70 kernels
    dom = _dom(page, "?driver=590.44.01")
    assert "too-new" in dom.cells[(row, v100)]["class"].split()
    assert "too-new" not in dom.cells[(row, H100)]["class"].split()  # Hopper has no last branch
    dom = _dom(page, "?driver=580.95.05")
    assert "too-new" not in dom.cells[(row, v100)]["class"].split()  # R580 itself drives it
    dom = _dom(page, "?driver=590.44.01&only=1")
    assert "hidden" in dom.cells[(row, v100)]["class"].split()
    assert "hidden" not in dom.cells[(ROW, H100)]["class"].split()
    dom = _dom(page, "?line=geforce")
    rtx4090 = next(g["id"] for g in gpus if g["short"] == "RTX 4090")
    assert "hidden" in dom.cells[(ROW, H100)]["class"].split()
    assert "hidden" not in dom.cells[(ROW, rtx4090)]["class"].split()

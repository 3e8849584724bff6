"""The WeasyPrint seam: only the report's own assets load, nothing else; renders stop at
their time limit; the same HTML gives the same bytes."""

from __future__ import annotations

import http.server
import io
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest
from pypdf import PdfReader

from reports import pdf

PAGE = """<!DOCTYPE html><html><head><link rel="stylesheet" href="report.css"></head>
<body><h1 data-running="Probe">Probe page</h1><p>Marker text 4711.</p>{images}</body></html>"""


class _CountingHandler(http.server.BaseHTTPRequestHandler):
    hits: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        type(self).hits.append(self.path)
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def http_server() -> Iterator[tuple[str, list[str]]]:
    """A web server on loopback that records every request it gets."""
    _CountingHandler.hits = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _CountingHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", _CountingHandler.hits
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def _images(pdf_bytes: bytes) -> int:
    count = 0
    for page in PdfReader(io.BytesIO(pdf_bytes)).pages:
        count += len(page.images)
    return count


def test_the_allow_list_serves_the_stylesheet_and_nothing_outside_its_folder(tmp_path: Path) -> None:
    allow = pdf.AssetAllowList.of(pdf.ASSETS_DIR)
    assert allow.resolve(allow.base_url + "report.css") == pdf.ASSETS_DIR / "report.css"
    for url in (
        "file:///etc/passwd",
        allow.base_url + "../pdf.py",
        allow.base_url + "%2e%2e/pdf.py",
        "file://evil.example/etc/passwd",
        "http://127.0.0.1/report.css",
        "data:image/svg+xml;base64,PHN2Zy8+",
        "report.css",
    ):
        with pytest.raises(pdf.RefusedURL):
            allow.resolve(url)


def test_a_symlink_in_the_assets_folder_cannot_reach_outside_it(tmp_path: Path) -> None:
    assets = tmp_path / "assets"
    assets.mkdir()
    (assets / "style.css").write_text("p { color: red }")
    (assets / "leak.css").symlink_to("/etc/passwd")
    allow = pdf.AssetAllowList.of(assets)
    assert allow.resolve(allow.base_url + "style.css") == (assets / "style.css").resolve()
    with pytest.raises(pdf.RefusedURL):
        allow.resolve(allow.base_url + "leak.css")


def test_local_files_and_web_images_are_refused_and_the_render_completes(
    http_server: tuple[str, list[str]],
) -> None:
    base, hits = http_server
    images = (
        '<img src="file:///etc/passwd">'
        f'<img src="{base}/tracker.png">'
        '<img src="../pdf.py">'
        '<p style="background: url(file:///etc/hostname)">styled</p>'
    )
    result = pdf.html_to_pdf(PAGE.format(images=images), timeout_s=60)
    assert result.pdf.startswith(b"%PDF-")
    assert result.pages == 1
    assert "file:///etc/passwd" in result.refused
    assert f"{base}/tracker.png" in result.refused
    assert "file:///etc/hostname" in result.refused
    assert any(url.endswith("/reports/pdf.py") for url in result.refused)
    assert not any(url.endswith("/report.css") for url in result.refused)
    assert hits == []
    assert _images(result.pdf) == 0
    text = PdfReader(io.BytesIO(result.pdf)).pages[0].extract_text()
    assert "Marker text 4711." in text


def test_a_render_that_outruns_its_time_limit_is_stopped() -> None:
    started = time.monotonic()
    with pytest.raises(pdf.ReportRenderTimeout, match=r"did not finish within 0\.2 s"):
        pdf.html_to_pdf(PAGE.format(images=""), timeout_s=0.2)
    assert time.monotonic() - started < 5


def test_a_crashing_renderer_is_reported_with_its_message() -> None:
    with pytest.raises(pdf.ReportRenderError, match="exited with status"):
        pdf.html_to_pdf(PAGE.format(images=""), memory_mb=64)


def test_the_same_html_and_identifier_give_the_same_bytes() -> None:
    html = PAGE.format(images="")
    first = pdf.html_to_pdf(html, identifier=b"0123456789abcdef")
    second = pdf.html_to_pdf(html, identifier=b"0123456789abcdef")
    assert first.pdf == second.pdf

"""The one place WeasyPrint runs: report HTML to PDF in a child process, fetching only
the report's own assets.

Why a child process rather than a thread: a thread cannot be stopped, so a document that
makes layout run away (an enormous table, a pathological stylesheet) would hold a Celery
worker for ever; a child can be killed at the time limit, capped in memory, and a crash
in the native text stack (Pango, HarfBuzz) takes only the child down. The cost is the
child's own import of WeasyPrint, which a one-off render pays anyway, and the parent
never imports WeasyPrint at all.

Resources: the only URLs the document may load are regular files in the assets folder,
fetched by `file:` URL (the stylesheet); WeasyPrint resolves relative URLs against that
folder. Everything else (other files, `http:`, `data:`, anything with a host) is refused
and listed in the result, and the render carries on without it. The fetcher never opens
a network connection, so there is no redirect to follow.
"""

from __future__ import annotations

import argparse
import json
import logging
import mimetypes
import os
import resource
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit
from urllib.request import url2pathname

log = logging.getLogger(__name__)

ASSETS_DIR = Path(__file__).resolve().with_name("assets")
PROJECT_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TIMEOUT_S = 60.0
DEFAULT_MEMORY_MB = 3072
_CHILD_ENV = frozenset({"PATH", "HOME", "LANG", "LANGUAGE", "TMPDIR", "TZ", "SYSTEMROOT"})


class ReportRenderError(RuntimeError):
    """The PDF could not be produced; the message says why and what to look at."""


class ReportRenderTimeout(ReportRenderError):
    """Rendering exceeded its time limit and the renderer was stopped."""


class RefusedURL(ValueError):
    """A URL the report may not load."""


@dataclass(frozen=True)
class AssetAllowList:
    """The files a report may load: the regular files directly inside one folder."""

    root: Path
    files: frozenset[Path]

    @classmethod
    def of(cls, root: Path) -> AssetAllowList:
        real_root = root.resolve()
        files = frozenset(
            p.resolve() for p in real_root.iterdir() if p.is_file() and p.resolve().parent == real_root
        )
        return cls(real_root, files)

    @property
    def base_url(self) -> str:
        return self.root.as_uri() + "/"

    def resolve(self, url: str) -> Path:
        """The asset file a URL names; raises RefusedURL for anything else."""
        parts = urlsplit(url)
        if parts.scheme.lower() != "file":
            raise RefusedURL(
                f"{url}: only the report's own files may be loaded, not {parts.scheme or 'relative'} URLs"
            )
        if parts.netloc not in ("", "localhost"):
            raise RefusedURL(f"{url}: file URLs with a host are not loaded")
        path = Path(url2pathname(unquote(parts.path))).resolve()
        if path not in self.files:
            raise RefusedURL(f"{url}: not one of the report's assets in {self.root}")
        return path


def asset_fetcher(allow: AssetAllowList) -> Any:
    """A WeasyPrint URL fetcher serving `allow`'s files and refusing the rest.

    Built here rather than at import time so that only the rendering child imports
    WeasyPrint; `refused` collects every URL turned away, in order.
    """
    from weasyprint.urls import URLFetcher, URLFetcherResponse

    class AssetFetcher(URLFetcher):
        def __init__(self) -> None:
            super().__init__(allowed_protocols=("file",), allow_redirects=False, fail_on_errors=False)
            self.refused: list[str] = []

        def fetch(self, url: str, headers: Any = None) -> Any:
            try:
                path = allow.resolve(url)
            except RefusedURL as refusal:
                self.refused.append(url)
                log.warning("report asset refused: %s", refusal)
                raise
            mime = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
            return URLFetcherResponse(path.as_uri(), body=path.read_bytes(), headers={"Content-Type": mime})

    return AssetFetcher()


@dataclass(frozen=True)
class PdfResult:
    pdf: bytes
    pages: int
    refused: tuple[str, ...]
    seconds: float


class PdfRenderer:
    """One rendering child, started ahead of the HTML so that its WeasyPrint import
    overlaps the caller's own work (building content and plots).

    The time limit runs from the start. Use as a context manager: leaving it kills a
    child that is still running, whatever happened in between.
    """

    def __init__(
        self,
        *,
        assets: Path = ASSETS_DIR,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        memory_mb: int = DEFAULT_MEMORY_MB,
    ) -> None:
        self.assets = assets
        self.timeout_s = timeout_s
        self.started = time.monotonic()
        python_path = os.pathsep.join(filter(None, [str(PROJECT_ROOT), os.environ.get("PYTHONPATH")]))
        # The child needs no credentials: it gets the locale, font and temp settings only.
        env = {
            k: v
            for k, v in os.environ.items()
            if k in _CHILD_ENV or k.startswith(("LC_", "XDG_", "FONTCONFIG"))
        }
        self._proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "reports.pdf",
                "--memory-mb",
                str(memory_mb),
                "--cpu-s",
                str(int(timeout_s) + 5),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=PROJECT_ROOT,
            env={**env, "PYTHONPATH": python_path},
        )

    def __enter__(self) -> PdfRenderer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the child if it is still running and reap it."""
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.communicate()

    def render(self, html: str, *, identifier: bytes | None = None) -> PdfResult:
        """Send the HTML and wait for the PDF, within what is left of the time limit.

        `identifier` fixes the PDF's file identifier, which with WeasyPrint's otherwise
        deterministic output makes the same HTML give the same bytes.
        """
        request = {
            "html": html,
            "assets": str(self.assets),
            "identifier": identifier.hex() if identifier else None,
        }
        remaining = max(0.01, self.timeout_s - (time.monotonic() - self.started))
        try:
            out, err = self._proc.communicate(json.dumps(request).encode(), timeout=remaining)
        except subprocess.TimeoutExpired:
            self.close()
            raise ReportRenderTimeout(
                f"rendering the report PDF did not finish within {self.timeout_s:g} s and was stopped; the "
                "document may be pathological (look at report.html next to the findings) or the machine "
                "overloaded; raise REPORT_RENDER_TIMEOUT_S if reports are legitimately this large"
            ) from None
        if self._proc.returncode != 0:
            tail = err.decode(errors="replace").strip().splitlines()[-8:]
            if tail:
                raise ReportRenderError(
                    f"the PDF renderer exited with status {self._proc.returncode}: " + " | ".join(tail)
                )
            raise ReportRenderError(
                f"the PDF renderer exited with status {self._proc.returncode} and no message "
                "(killed for exceeding its memory or CPU limit?)"
            )
        header, _, pdf_bytes = out.partition(b"\n")
        try:
            meta = json.loads(header.decode())
        except ValueError:
            raise ReportRenderError(
                f"the PDF renderer answered {header[:200]!r}, not its JSON summary"
            ) from None
        if not pdf_bytes.startswith(b"%PDF-"):
            raise ReportRenderError("the PDF renderer's output does not start with a PDF header")
        return PdfResult(
            pdf=pdf_bytes,
            pages=int(meta["pages"]),
            refused=tuple(meta["refused"]),
            seconds=time.monotonic() - self.started,
        )


def html_to_pdf(
    html: str,
    *,
    assets: Path = ASSETS_DIR,
    identifier: bytes | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    memory_mb: int = DEFAULT_MEMORY_MB,
) -> PdfResult:
    """Render `html` to PDF in a child process, within `timeout_s` seconds and `memory_mb` MiB."""
    with PdfRenderer(assets=assets, timeout_s=timeout_s, memory_mb=memory_mb) as renderer:
        return renderer.render(html, identifier=identifier)


def _limit_resources(memory_mb: int, cpu_s: int) -> None:
    memory = memory_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 5))


def _child(argv: list[str]) -> int:
    """The rendering child: import WeasyPrint, then read one request on stdin and answer on
    stdout with a JSON summary line followed by the PDF bytes."""
    parser = argparse.ArgumentParser(prog="python -m reports.pdf", description="Render report HTML to PDF.")
    parser.add_argument("--memory-mb", type=int, default=DEFAULT_MEMORY_MB)
    parser.add_argument("--cpu-s", type=int, default=int(DEFAULT_TIMEOUT_S) + 5)
    args = parser.parse_args(argv)
    _limit_resources(args.memory_mb, args.cpu_s)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(name)s: %(message)s")
    # WeasyPrint's HTML cascade also reads the inline SVG plots' style attributes and warns
    # once per SVG property it does not know (thousands per report); the SVG renderer uses
    # them all the same. Only its errors are worth a line; refused URLs are reported apart.
    logging.getLogger("weasyprint").setLevel(logging.ERROR)

    from weasyprint import HTML

    request = json.load(sys.stdin)
    allow = AssetAllowList.of(Path(request["assets"]))
    fetcher = asset_fetcher(allow)
    document = HTML(string=request["html"], base_url=allow.base_url, url_fetcher=fetcher).render()
    identifier = bytes.fromhex(request["identifier"]) if request.get("identifier") else None
    pdf_bytes = document.write_pdf(pdf_identifier=identifier)
    summary = json.dumps({"pages": len(document.pages), "refused": fetcher.refused})
    sys.stdout.buffer.write(summary.encode() + b"\n" + pdf_bytes)
    sys.stdout.buffer.flush()
    return 0


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1:]))

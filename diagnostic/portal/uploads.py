"""Uploaded files are held to their limit while they arrive, not after.

Django's own handlers keep a file in memory up to 2.5 MB and write anything larger to a
temporary file on disk, whole, before a view can look at its size. The portal's one upload
(a diagnostic.config/1 file, at most YAML_MAX_BYTES) needs neither: this handler, the only
one (FILE_UPLOAD_HANDLERS), keeps at most the limit and one byte more of each file, in
memory, and only counts what follows, which is dropped as it comes. Nothing of an upload
is ever written to disk.

The file the view gets says its whole size (`size`) and holds its first bytes, so the
view's check (diagnostic.portal.submission.yaml_text_from_upload) refuses it beside its
field, naming the size and the limit, and the rest of the form arrives as sent.
"""

from __future__ import annotations

from io import BytesIO
from typing import Any

from django.core.files.uploadedfile import InMemoryUploadedFile
from django.core.files.uploadhandler import FileUploadHandler

from diagnostic.portal.submission import YAML_MAX_BYTES

# What is kept of one file: enough to know it is over the limit.
KEPT_BYTES = YAML_MAX_BYTES + 1


class BoundedUploadHandler(FileUploadHandler):
    """Keeps the first KEPT_BYTES of each uploaded file in memory and counts the rest."""

    def new_file(self, *args: Any, **kwargs: Any) -> None:
        super().new_file(*args, **kwargs)
        self.kept = BytesIO()
        self.received = 0

    def receive_data_chunk(self, raw_data: bytes, start: int) -> None:
        self.received += len(raw_data)
        room = KEPT_BYTES - self.kept.tell()
        if room > 0:
            self.kept.write(raw_data[:room])
        return None  # no other handler gets the chunk

    def file_complete(self, file_size: int) -> InMemoryUploadedFile:
        self.kept.seek(0)
        return InMemoryUploadedFile(
            file=self.kept,
            field_name=self.field_name,
            name=self.file_name,
            content_type=self.content_type,
            size=self.received,
            charset=self.charset,
            content_type_extra=self.content_type_extra,
        )

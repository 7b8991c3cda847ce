"""What every upload shares (``/v1/files``, ``/v1/messages/batches``): at most a few of a
client's at once, the client's quota of bytes and files, and a disk that fills up.

Ten 190 MB uploads took 1.9 GB in 1.9 s, for nothing, without end; 300 uploads trickled
at 5.5 KB/s held 300 connections. Now a client has at most ``client_uploads`` under way
(the next is a 429 before its body is read), each within ``upload_timeout_s`` in all (see
``_body.within_body_timeout``), and may hold ``client_file_bytes`` and ``client_files``:
checked when an upload starts, as its bytes arrive (counting its other uploads under way)
and, authoritatively, when it is recorded. What it holds counts every file of its on the
server, the outputs of its batches too; files expire (``_expiry``).

An upload is written to a temporary file and renamed into place once whole and checked,
then recorded; a full disk (or a record that cannot be written) is a 507 and leaves
neither a half file nor a row pointing at nothing.
"""

from __future__ import annotations

import contextlib
import errno
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

from ..._errors import StoreError
from ._db import BatchDB, FileRow

__all__ = [
    "UPLOAD_PREFIX",
    "TooLarge",
    "Upload",
    "UploadRefused",
    "Uploads",
    "is_full",
    "no_room",
    "record",
    "write_chunks",
]

MB = 1024 * 1024
#: An upload under way is ``files/.upload-<random>`` until it is whole (any left at startup were cut off).
UPLOAD_PREFIX = ".upload-"


class UploadRefused(Exception):
    """An upload refused: its HTTP status and words (each API shapes its own error)."""

    def __init__(self, status: int, message: str, code: str | None = None, *, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.retry_after = retry_after


class TooLarge(Exception):
    """The upload passed the size it may have (the caller says so its own way)."""

    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.size = size


class Uploads:
    """The uploads under way, by client: how many, and the bytes they have brought."""

    def __init__(self, *, per_client: int, quota_bytes: int, quota_files: int) -> None:
        self.per_client = per_client
        self.quota_bytes = quota_bytes
        self.quota_files = quota_files
        self._count: dict[str, int] = {}
        self._bytes: dict[str, int] = {}

    @contextlib.contextmanager
    def begin(self, client: str, db: BatchDB) -> Iterator[Upload]:
        """One upload of ``client``'s: :class:`UploadRefused` when it has as many under way
        as it may, or holds its quota already."""
        under_way = self._count.get(client, 0)
        if under_way >= self.per_client:
            raise UploadRefused(
                429,
                f"{under_way} uploads of yours are under way, as many as this server takes at once; "
                "retry when one has finished",
                "rate_limit_exceeded",
                retry_after=5,
            )
        files, held = db.holdings(client)
        if files + under_way >= self.quota_files:
            raise UploadRefused(
                400,
                f"you hold {files:,} files on this server, as many as it keeps for you; "
                "delete files you no longer need (files also expire)",
                "quota_exceeded",
            )
        upload = Upload(self, client, held)
        self._count[client] = under_way + 1
        try:
            upload.add(0)
            yield upload
        finally:
            self._count[client] -= 1
            self._bytes[client] = self._bytes.get(client, 0) - upload.size
            if not self._count[client]:
                del self._count[client], self._bytes[client]

    def over_quota(self, held: int) -> UploadRefused:
        return UploadRefused(
            400,
            f"this upload would take your files on this server past their quota of {_size(self.quota_bytes)} "
            f"(you hold {_size(held)}); delete files you no longer need (files also expire)",
            "quota_exceeded",
        )


def _size(n: int) -> str:
    return f"{n / MB:,.1f} MB" if n >= MB else f"{n:,} bytes"


class Upload:
    """One upload under way: its bytes counted against its client's quota as they arrive."""

    def __init__(self, uploads: Uploads, client: str, held: int) -> None:
        self._uploads = uploads
        self.client = client
        self._held = held
        self.size = 0

    def add(self, n: int) -> None:
        """``n`` more bytes arrived: :class:`UploadRefused` past the quota (with the
        client's other uploads under way)."""
        self.size += n
        uploads = self._uploads
        under_way = uploads._bytes[self.client] = uploads._bytes.get(self.client, 0) + n
        if self._held + under_way > uploads.quota_bytes:
            raise uploads.over_quota(self._held)

    def check(self, db: BatchDB, size: int) -> None:
        """The last word, as the file is recorded (nothing awaited between this and the record):
        what the client holds now and ``size`` bytes more within its quota."""
        files, held = db.holdings(self.client)
        if held + size > self._uploads.quota_bytes:
            raise self._uploads.over_quota(held)
        if files >= self._uploads.quota_files:
            raise UploadRefused(
                400, f"you hold {files:,} files on this server, as many as it keeps for you", "quota_exceeded"
            )


def no_room() -> UploadRefused:
    return UploadRefused(
        507, "the server has no room left to store this upload; nothing of it was kept", "insufficient_storage"
    )


def is_full(exc: OSError) -> bool:
    """Whether ``exc`` says the disk (or the quota of the server's user) is full."""
    return exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


async def write_chunks(chunks: AsyncIterator[bytes], path: Path, upload: Upload, limit: int) -> int:
    """``chunks`` written to ``path`` (a temporary file), counted against the quota as they
    come: its size; :class:`TooLarge` past ``limit``, :class:`UploadRefused` past the
    quota or for a full disk (the caller removes ``path``)."""
    size = 0
    try:
        with path.open("wb") as out:
            async for chunk in chunks:
                size += len(chunk)
                if size > limit:
                    raise TooLarge(size)
                upload.add(len(chunk))
                out.write(chunk)
    except OSError as exc:
        if is_full(exc):
            raise no_room() from None
        raise
    return size


def record(db: BatchDB, row: FileRow, temp: Path, final: Path, upload: Upload | None = None) -> FileRow:
    """``temp`` renamed to ``final`` and ``row`` recorded, or neither (:class:`UploadRefused`:
    over the quota, or a 507 when the disk or the record fails). ``upload``: check its quota."""
    if upload is not None:
        upload.check(db, row.bytes)
    try:
        temp.rename(final)
    except OSError as exc:
        if is_full(exc):
            raise no_room() from None
        raise
    try:
        return db.add_file(row)
    except StoreError:
        with contextlib.suppress(FileNotFoundError):
            final.unlink()
        raise UploadRefused(
            507,
            "the server could not record this upload (its disk may be full); nothing of it was kept",
            "insufficient_storage",
        ) from None

"""Images as messages carry them: data URLs in memory and on the wire, bytes in Parquet.

An image is a ``data:`` URL or an ``http(s)`` URL kept as it is (the policy server fetches
it); a task's image file becomes a data URL when the task is read, so no episode depends on
a file another node cannot see. Data URLs are canonical, so Parquet keeps the bytes once.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import io
import re
from pathlib import Path
from typing import Any

from rayrollout.data.errors import ImageError

__all__ = [
    "ImageError",
    "canonical_data_url",
    "data_url",
    "decode_data_url",
    "image_bytes",
    "image_digest",
    "image_size",
    "is_data_url",
    "is_remote_url",
    "resolve_image_url",
    "sniff_mime",
    "thumbnail",
]

_DATA_URL = re.compile(r"data:(?P<mime>[\w.+-]+/[\w.+-]+)?(?P<params>(;[^;,]*)*?);base64,", re.I)
# The magic numbers of the formats vision models take, for bytes that come without a type.
_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
    (b"BM", "image/bmp"),
)


def is_data_url(url: str) -> bool:
    return url[:5].lower() == "data:"


def is_remote_url(url: str) -> bool:
    return url[:7].lower() == "http://" or url[:8].lower() == "https://"


def sniff_mime(data: bytes) -> str | None:
    """The image type of ``data`` from its first bytes (None: not one known here)."""
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    for magic, mime in _MAGIC:
        if data.startswith(magic):
            return mime
    return None


def data_url(data: bytes, mime: str | None = None) -> str:
    """``data`` as a canonical data URL; ``mime`` defaults to what the bytes say they are."""
    mime = mime or sniff_mime(data)
    if mime is None:
        raise ImageError(
            "bytes of no known image format (PNG, JPEG, GIF, WebP, BMP); give the MIME type"
        )
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


def decode_data_url(url: str) -> tuple[str, bytes]:
    """A base64 data URL's ``(mime, bytes)``; raises ``ImageError`` naming the fault."""
    match = _DATA_URL.match(url)
    if match is None:
        raise ImageError(
            f"not a base64 data URL (data:<type>;base64,<data>): {url[:40]!r}"
            + ("..." if len(url) > 40 else "")
        )
    try:
        data = base64.b64decode(url[match.end() :], validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ImageError(f"the data URL's base64 is malformed: {exc}") from None
    mime = (match.group("mime") or "").lower() or sniff_mime(data)
    if mime is None:
        raise ImageError("the data URL names no type and its bytes are of no known image format")
    return mime, data


@functools.lru_cache(maxsize=32)
def canonical_data_url(url: str) -> str:
    """``url`` in the canonical form (the same string when it is in it already).

    Cached: a message is validated again each time it is rebuilt (a row read back, a turn's
    messages copied), and an episode shows the same picture turn after turn; a hit costs a
    hash and a compare, not a base64 decode and encode."""
    mime, data = decode_data_url(url)
    canonical = data_url(data, mime)
    return url if canonical == url else canonical


def image_digest(data: bytes) -> str:
    """The SHA-256 hex digest that names an image in a row's ``images`` column."""
    return hashlib.sha256(data).hexdigest()


def image_size(data: bytes) -> tuple[int | None, int | None]:
    """``(width, height)`` in pixels, read from the header by Pillow; ``(None, None)`` for
    bytes Pillow cannot read (the image still travels: only the figure is missing)."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as image:
            width, height = image.size
    except (UnidentifiedImageError, OSError, ValueError):
        return None, None
    return int(width), int(height)


def image_bytes(value: Any) -> tuple[str, bytes] | None:
    """``(mime, bytes)`` of an image value a tool may return: a Pillow image (as PNG), raw
    image bytes, or an MCP image content item ``{"type": "image", "data": <base64>,
    "mimeType": ...}``; None for any other value (text, JSON)."""
    if isinstance(value, bytes | bytearray | memoryview):
        data = bytes(value)
        mime = sniff_mime(data)
        if mime is None:
            raise ImageError("a tool returned bytes of no known image format")
        return mime, data
    if isinstance(value, dict) and value.get("type") == "image" and "data" in value:
        try:
            data = base64.b64decode(str(value["data"]), validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ImageError(f"an MCP image item's data is not base64: {exc}") from None
        mime = value.get("mimeType") or sniff_mime(data)
        if not isinstance(mime, str):
            raise ImageError("an MCP image item names no mimeType and its bytes are unknown")
        return mime, data
    module = type(value).__module__
    if module.startswith("PIL.") and hasattr(value, "save"):
        buffer = io.BytesIO()
        value.save(buffer, format="PNG")
        return "image/png", buffer.getvalue()
    return None


def resolve_image_url(url: str, base_dir: Path | None) -> str:
    """An image reference of a task as a message holds it.

    A data URL comes back canonical; an ``http(s)`` URL as it is (never fetched here); a
    ``file:`` URL or a path is read, relative to ``base_dir`` (the task file's folder),
    and comes back as a data URL. Raises ``ImageError`` naming what is wrong.
    """
    if is_data_url(url):
        return canonical_data_url(url)
    if is_remote_url(url):
        return url
    if "://" in url and not url.lower().startswith("file://"):
        raise ImageError(
            f"unsupported image URL scheme: {url[:40]!r} (use data:, http(s) or a path)"
        )
    path = Path(url[7:] if url.lower().startswith("file://") else url)
    if not path.is_absolute():
        if base_dir is None:
            raise ImageError(
                f"relative image path {url!r}: paths are read relative to the task file, "
                "and these tasks come from no file (give an absolute path or a data URL)"
            )
        path = base_dir / path
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ImageError(f"cannot read image file {str(path)!r}: {exc.strerror or exc}") from None
    return data_url(data, sniff_mime(data))


def thumbnail(data: bytes, side: int = 96) -> str | None:
    """A PNG data URL of the image shrunk to fit ``side`` pixels (a report's thumbnail);
    None for bytes Pillow cannot read."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as image:
            small = image.convert("RGB")
            small.thumbnail((side, side))
    except (UnidentifiedImageError, OSError, ValueError):
        return None
    buffer = io.BytesIO()
    small.save(buffer, format="PNG", optimize=True)
    return data_url(buffer.getvalue(), "image/png")

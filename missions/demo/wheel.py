"""A pure-Python wheel made with the standard library alone: the demo repository carries
one, so that its declared environment installs a real package with no network
(`pip install --no-index --find-links wheels`, docs/ENVIRONMENTS.md)."""

from __future__ import annotations

import base64
import hashlib
import io
import zipfile


def wheel_name(name: str, version: str) -> str:
    return f"{name}-{version}-py3-none-any.whl"


def wheel(name: str, version: str, modules: dict[str, str]) -> bytes:
    """The wheel of distribution `name` holding `modules` ({path in site-packages: text}):
    the files, then METADATA, WHEEL and RECORD (each file's sha256 and size), as a valid
    wheel has them. The same arguments give the same bytes."""
    info = f"{name}-{version}.dist-info"
    files = {
        **modules,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: fusion-missions\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = [f"{path},sha256={_digest(text.encode())},{len(text.encode())}" for path, text in files.items()]
    files[f"{info}/RECORD"] = "\n".join([*record, f"{info}/RECORD,,"]) + "\n"
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
        for path, text in files.items():
            zf.writestr(zipfile.ZipInfo(path, date_time=(2020, 1, 1, 0, 0, 0)), text)
    return out.getvalue()


def _digest(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()

"""Real photos larger than the dataset's 224-px copies, for the tests of the preparation (docs/bundle.md, "The
preparation"): scikit-image's sample photos, taken from its PyPI wheel by exact version (the package itself is
never installed) and checked by sha256, so the trainer and the server's tests read the same bytes."""
from __future__ import annotations

import hashlib
import subprocess
import sys
import zipfile
from pathlib import Path

WHEEL = "scikit-image==0.26.0"
# name in the wheel's skimage/data/ -> sha256 (a JPEG, landscapes and a square, 300 to 640 px)
PHOTOS = {
    "rocket.jpg": "c2dd0de7c538df8d111e479619b129464d0269d0ae5fd18ca91d33a7fdfea95c",      # 640x427, JPEG
    "chelsea.png": "596aa1e7cb875eb79f437e310381d26b338a81c2da23439704a73c4651e8c4bb",     # 451x300
    "coffee.png": "cc02f8ca188b167c775a7101b5d767d1e71792cf762c33d6fa15a4599b5a8de7",      # 600x400
    "astronaut.png": "88431cd9653ccd539741b555fb0a46b61558b301d4110412b5bc28b5e3ea6cb5",   # 512x512
}
DEFAULT_DIR = Path(".cache/photos")


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def fetch(out: str | Path = DEFAULT_DIR, hashes: dict[str, str | None] | None = None) -> list[Path]:
    """The photos in `out`, downloading the wheel once (into `out`/wheel) when one is missing."""
    out = Path(out)
    hashes = PHOTOS if hashes is None else hashes
    paths = [out / n for n in hashes]
    if all(p.exists() for p in paths):
        return paths
    wheels = out / "wheel"
    found = sorted(wheels.glob("scikit_image-0.26.0-*.whl"))
    if not found:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:",
                        "-d", str(wheels), WHEEL], check=True)
        found = sorted(wheels.glob("scikit_image-0.26.0-*.whl"))
    with zipfile.ZipFile(found[0]) as z:
        for name, want in hashes.items():
            data = z.read(f"skimage/data/{name}")
            if want is not None and _sha256(data) != want:
                raise SystemExit(f"{found[0].name}: skimage/data/{name} has sha256 {_sha256(data)}, expected {want}")
            (out / name).write_bytes(data)
    return paths

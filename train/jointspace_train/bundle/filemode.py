"""The mode of the files a bundle is made of: readable by a server that runs as another user."""
from __future__ import annotations

import os


def shareable(path) -> None:
    """safetensors writes owner-only files (0600); a bundle is read by a server that may run as another user
    (the container's uid 10001), so its files get the usual mode the umask allows, as open() would."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)

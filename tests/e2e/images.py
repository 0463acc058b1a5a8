"""ringseed's images for the e2e tests: built once per session with hack/image.sh (cached by podman).

Owns the image tags the tests and the e2e manifests use (``ringseed:dev``, ``ringseed:dev-training``,
as in examples/cluster/) and the podman command (hack/podman.sh, with this machine's settings).
:func:`ensure` also returns the image ID each tag named once built: the tests run containers by ID,
as a kubelet runs what it pulled, so a build of another checkout moving the tags on the same
machine (a shared podman store) cannot swap the image under a session.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import time
from dataclasses import dataclass

from tests.conftest import REPO

PODMAN = ["bash", str(REPO / "hack" / "podman.sh")]
TAGS = {"runtime": "ringseed:dev", "training": "ringseed:dev-training"}


@dataclass(frozen=True)
class Images:
    seconds: float  # what hack/image.sh took in this session
    sizes: dict[str, int]  # tag -> bytes
    ids: dict[str, str]  # tag -> image ID this session built (or found) for it

    def tag(self, target: str) -> str:
        return TAGS[target]


def cannot_build() -> str | None:
    """None when the images can be built here, else why not (for skips)."""
    if os.geteuid() != 0:
        return "not root: podman's rootful store and debootstrap (the stand-in base image) need root"
    if shutil.which("podman") is None and shutil.which("apt-get") is None:
        return "podman is not installed and apt-get is not available to install it"
    return None


@functools.cache
def ensure() -> Images:
    """Build (or find cached) both targets; fails with the script's output when the build fails."""
    started = time.monotonic()
    env = {**os.environ, "IMAGE": TAGS["runtime"], "TRAINING_IMAGE": TAGS["training"]}
    done = subprocess.run(
        ["bash", str(REPO / "hack" / "image.sh")], capture_output=True, text=True, env=env, timeout=1800, check=False
    )
    if done.returncode != 0:
        raise AssertionError(f"hack/image.sh failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    sizes, ids = {}, {}
    for tag in TAGS.values():
        out = subprocess.run(
            [*PODMAN, "image", "inspect", "--format", "{{.Size}} {{.Id}}", tag], capture_output=True, text=True
        )
        size, image_id = out.stdout.split()
        sizes[tag], ids[tag] = int(size), image_id
    return Images(seconds=time.monotonic() - started, sizes=sizes, ids=ids)

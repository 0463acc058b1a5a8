"""The image, built for real with podman (hack/image.sh), runs as the chart's pods demand.

Both targets: uid 10001, a read-only root filesystem, no capabilities, no privilege escalation,
and ``ringseed --version`` answering; the training target imports torch and registers the
``ringseed`` backend. Root only (podman and the stand-in base need it); the skip says why.
"""

from __future__ import annotations

import json
import subprocess

import pytest

import ringseed
from tests.e2e import images

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.image,
    pytest.mark.skipif(images.cannot_build() is not None, reason=str(images.cannot_build())),
]

RESTRICTED = ["--read-only", "--read-only-tmpfs=false", "--cap-drop=all", "--security-opt=no-new-privileges"]


@pytest.fixture(scope="module")
def built() -> images.Images:
    return images.ensure()


def run(image: str, *args: str, entrypoint: str | None = None) -> str:
    options = [*RESTRICTED, "--network=none", "--rm"] + ([f"--entrypoint={entrypoint}"] if entrypoint else [])
    done = subprocess.run(
        [*images.PODMAN, "run", *options, image, *args], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, f"{image} {args}: exit {done.returncode}: {done.stderr[-2000:]}"
    return done.stdout


@pytest.mark.parametrize("target", ["runtime", "training"])
def test_runs_as_10001_read_only_without_capabilities(built: images.Images, target: str) -> None:
    image = built.tag(target)
    assert run(image, "--version").strip() == ringseed.__version__
    probe = (
        "import json, os\n"
        "status = dict(line.split(':', 1) for line in open('/proc/self/status') if ':' in line)\n"
        "try:\n"
        "    open('/opt/venv/probe', 'w')\n"
        "    writable = True\n"
        "except OSError:\n"
        "    writable = False\n"
        "print(json.dumps({'uid': os.getuid(), 'gid': os.getgid(), 'writable_root': writable,\n"
        "                  'cap_eff': status['CapEff'].strip(), 'cap_bnd': status['CapBnd'].strip(),\n"
        "                  'no_new_privs': status['NoNewPrivs'].strip()}))\n"
    )
    facts = json.loads(run(image, "-c", probe, entrypoint="python"))
    assert facts == {
        "uid": 10001,
        "gid": 10001,
        "writable_root": False,
        "cap_eff": "0000000000000000",
        "cap_bnd": "0000000000000000",
        "no_new_privs": "1",
    }


def test_training_target_has_torch_and_the_ringseed_backend(built: images.Images) -> None:
    code = (
        "import torch, torch.distributed as dist, ringseed.collective.torch_backend as b\n"
        "print(torch.__version__, b.BACKEND in dist.Backend.backend_list)\n"
    )
    version, registered = run(built.tag("training"), "-c", code, entrypoint="python").split()
    assert version.startswith("2.") and "+cpu" in version
    assert registered == "True"


def test_default_target_has_no_torch(built: images.Images) -> None:
    code = "import importlib.util; print(importlib.util.find_spec('torch') is None)"
    assert run(built.tag("runtime"), "-c", code, entrypoint="python").strip() == "True"


def test_default_target_can_run_the_data_mount_sidecar(built: images.Images) -> None:
    """The sidecar (builders_cache.mount_sidecars) runs ``ringseed mount`` (a dataset mount: libfuse 3's
    low-level API through ctypes; fusepy over libfuse 2 the fallback) and unmounts with ``fusermount -u``
    on preStop: all must be in the image, not only on a dev machine."""
    code = ("import fuse, shutil; from ringseed.fs import libfuse3; libfuse3.load(); "
            "print(fuse.__name__, bool(shutil.which('fusermount')), 'libfuse3')")  # fmt: skip
    assert run(built.tag("runtime"), "-c", code, entrypoint="python").split() == ["fuse", "True", "libfuse3"]
    assert "usage" in run(built.tag("runtime"), "mount", "--help").lower()

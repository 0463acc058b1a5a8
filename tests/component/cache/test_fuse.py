"""The FUSE mount of the cache tree: POSIX writes, reads, listings, renames and refusals through a real mount."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ringseed.fs import datamount, libfuse3, reading, spec
from ringseed.local import cacheswarm
from tests.waiting import wait_for

MiB = 1 << 20


def _fuse_problem() -> str | None:
    if os.geteuid() != 0:
        return "not root: mounting FUSE needs root here"
    if not Path("/dev/fuse").exists():
        return "no /dev/fuse"
    return None


def _driver_problem(driver: str) -> str | None:
    try:
        if driver == "fusepy":
            import fuse  # noqa: F401
        else:
            libfuse3.load()
    except (ImportError, OSError, libfuse3.Unavailable) as exc:
        return f"{driver}: {exc} (apt-get install libfuse2 fuse3)"
    return None


pytestmark = pytest.mark.skipif(_fuse_problem() is not None, reason=_fuse_problem() or "")
needs_fusepy = pytest.mark.skipif(_driver_problem("fusepy") is not None, reason=_driver_problem("fusepy") or "")
needs_libfuse3 = pytest.mark.skipif(_driver_problem("libfuse3") is not None, reason=_driver_problem("libfuse3") or "")
DRIVERS = [pytest.param("fusepy", marks=needs_fusepy), pytest.param("libfuse3", marks=needs_libfuse3)]


@pytest.fixture(scope="module")
def swarm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[cacheswarm.CacheSwarm]:
    # Agents run as processes: a writer that blocks in a FUSE write while holding the GIL (torch's
    # C++ file writer does) must not share a process with the agent that serves the mount.
    work = tmp_path_factory.mktemp("fuse-swarm")
    source = work / "dataset"
    (source / "train").mkdir(parents=True)
    for i in range(50):
        (source / "train" / f"{i:03d}.txt").write_text(f"sample {i}\n" * (i + 1))
    local = cacheswarm.CacheSwarm(nodes=2, workdir=work, chunk_size=8 * MiB, data={"toy": f"file://{source}"})
    try:
        local.start()
        local.wait_ready(timeout=60)
        yield local
    finally:
        local.close()


@contextlib.contextmanager
def _mount(swarm: cacheswarm.CacheSwarm, root: Path, *args: str) -> Iterator[Path]:
    point = root / "mnt"
    point.mkdir()
    env = dict(os.environ, **swarm.env_for("node-0"))
    with open(root / "mount.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "ringseed.cli", "mount", str(point), *args], stdout=log,
                                stderr=subprocess.STDOUT, env=env)  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while not os.path.ismount(point):
            assert proc.poll() is None, (root / "mount.log").read_text()
            assert time.monotonic() < deadline, "mount did not appear"
            time.sleep(0.05)
        yield point
    finally:
        subprocess.run(["umount", "-l", str(point)], check=False, capture_output=True)
        proc.terminate()
        proc.wait(10)


@pytest.fixture(scope="module")
def mounted(swarm: cacheswarm.CacheSwarm, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    with _mount(swarm, tmp_path_factory.mktemp("fuse")) as point:
        yield point


def leader_meta(swarm: cacheswarm.CacheSwarm, path: str) -> dict[str, object]:
    status = swarm.leader()
    assert status is not None
    return swarm._get(f"{swarm.master_urls[status]}/v1/cache/stat?path={path}")  # type: ignore[no-any-return]


@needs_fusepy
def test_posix_writes_and_reads_through_the_mount(mounted: Path, swarm: cacheswarm.CacheSwarm) -> None:
    data = os.urandom(20 * MiB + 3)

    def posix() -> None:
        (mounted / "step-1").mkdir()
        with open(mounted / "step-1" / "model.pt", "wb") as f:
            for start in range(0, len(data), 1 << 20):
                f.write(data[start : start + (1 << 20)])
        assert (mounted / "step-1" / "model.pt").stat().st_size == len(data)
        assert (mounted / "step-1" / "model.pt").read_bytes() == data
        with open(mounted / "step-1" / "model.pt", "rb") as f:
            f.seek(9 * MiB)
            assert f.read(100) == data[9 * MiB : 9 * MiB + 100]
        assert sorted(os.listdir(mounted)) == ["step-1"]
        os.rename(mounted / "step-1" / "model.pt", mounted / "step-1" / "final.pt")
        assert os.listdir(mounted / "step-1") == ["final.pt"]

    posix()
    meta = leader_meta(swarm, "step-1/final.pt")
    assert meta["size"] == len(data)
    status = swarm.agent_status("node-1")
    assert status is not None and status["received_bytes"] >= len(data)  # replicated before close returned


@needs_fusepy
def test_refusals_keep_their_errno(mounted: Path) -> None:
    def posix() -> None:
        (mounted / "a.bin").write_bytes(b"once")
        with pytest.raises(OSError) as caught, open(mounted / "a.bin", "r+b"):  # update in place
            pass
        assert caught.value.errno == errno.EPERM
        with pytest.raises(OSError) as caught:
            (mounted / "data" / "x").write_bytes(b"no")
        assert caught.value.errno in (errno.EROFS, errno.EACCES, errno.ENOENT)
        with pytest.raises(FileNotFoundError):
            (mounted / "missing").read_bytes()
        os.unlink(mounted / "a.bin")
        assert "a.bin" not in os.listdir(mounted)

    posix()


@needs_fusepy
def test_torch_save_and_load_on_plain_paths(mounted: Path) -> None:
    torch = pytest.importorskip("torch", reason="torch is not installed")
    sd = {"w": torch.arange(100_000, dtype=torch.float32)}

    def roundtrip() -> object:
        (mounted / "ck").mkdir()
        torch.save(sd, mounted / "ck" / "model.pt")
        return torch.load(mounted / "ck" / "model.pt", weights_only=True)

    back = roundtrip()
    assert torch.equal(back["w"], sd["w"])  # type: ignore[index]


@needs_fusepy
def test_datasets_are_files_under_the_mount(mounted: Path) -> None:
    names = sorted(os.listdir(mounted / "data" / "toy" / "train"))
    assert len(names) == 50 and names[0] == "000.txt"
    assert (mounted / "data" / "toy" / "train" / "007.txt").read_text() == "sample 7\n" * 8
    assert (mounted / "data" / "toy" / "train" / "049.txt").stat().st_size == len("sample 49\n") * 50
    with pytest.raises(OSError) as caught:
        (mounted / "data" / "toy" / "new.txt").write_text("no")
    assert caught.value.errno in (errno.EROFS, errno.EACCES)


def _memory_hits(swarm: cacheswarm.CacheSwarm) -> int:
    status = swarm.agent_status("node-0")
    assert status is not None
    return int(status["sources"]["memory"])


@needs_fusepy
def test_a_file_read_again_comes_from_the_page_cache_and_a_rewrite_is_read_anew(
    mounted: Path, swarm: cacheswarm.CacheSwarm
) -> None:
    first, second = os.urandom(3 * MiB + 5), os.urandom(2 * MiB + 7)
    path = mounted / "again.bin"
    path.write_bytes(first)
    assert path.read_bytes() == first
    asked = _memory_hits(swarm)
    assert path.read_bytes() == first
    assert _memory_hits(swarm) == asked  # no chunk asked of the agent: the kernel kept the pages
    path.write_bytes(second)  # a new version of the path
    assert path.read_bytes() == second
    assert _memory_hits(swarm) > asked


class _Reader(reading.ChunkedReader):
    def __init__(self, path: str, identity: str) -> None:
        super().__init__()
        self.path, self.identity, self.size, self.spans = path, identity, 0, []


@needs_fusepy
def test_the_page_cache_is_kept_only_for_the_same_content_and_bypassed_while_two_are_open() -> None:
    from ringseed.fs import fuse

    ops = fuse.CacheOperations(fs=None, root="")  # type: ignore[arg-type]
    ops.told.update({"ck/a.pt": "v1", "ck/b.pt": "v7"})  # the identities the kernel's sizes came from
    v1 = ops._add(_Reader("ck/a.pt", "v1"))
    assert ops.page_cache(v1) == (False, False)  # first open: no pages to trust
    v1_again = ops._add(_Reader("ck/a.pt", "v1"))
    assert ops.page_cache(v1_again) == (True, False)  # the same content: keep the pages
    other = ops._add(_Reader("ck/b.pt", "v7"))
    assert ops.page_cache(other) == (False, False)  # another path is another file
    v2 = ops._add(_Reader("ck/a.pt", "v2"))
    assert ops.page_cache(v2) == (False, True)  # v1 still open: the kernel's pages could be either
    ops.release("/ck/a.pt", v1)
    ops.release("/ck/a.pt", v1_again)
    v2_alone = ops._add(_Reader("ck/a.pt", "v2"))
    assert ops.page_cache(v2_alone) == (False, True)  # the kernel's size is still v1's: read past it
    ops.release("/ck/a.pt", v2_alone)
    ops.told["ck/a.pt"] = "v2"  # the kernel asked for the attributes again
    v2_again = ops._add(_Reader("ck/a.pt", "v2"))
    assert ops.page_cache(v2_again) == (False, False)  # alone again: drop what is cached, cache anew
    assert ops.page_cache(ops._add(_Reader("ck/a.pt", "v2"))) == (True, False)
    assert ops.reading == {"ck/a.pt": {"v2": 3}, "ck/b.pt": {"v7": 1}}  # the open readers, by path


def _replace(path: Path, data: bytes, mtime: float) -> None:
    staged = path.with_suffix(".staged")
    staged.write_bytes(data)
    os.utime(staged, (mtime, mtime))
    staged.rename(path)


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_dataset_mount_reads_a_changed_source_anew_and_never_a_mix(tmp_path: Path, driver: str) -> None:
    source = tmp_path / "source"
    source.mkdir()
    same, grown = source / "same.bin", source / "grown.bin"
    old = {same: os.urandom(300_000), grown: os.urandom(200_000)}
    new = {same: os.urandom(300_000), grown: os.urandom(700_000)}  # one keeps its size, one grows
    for path, data in old.items():
        _replace(path, data, time.time() - 100)
    local = cacheswarm.CacheSwarm(nodes=1, workdir=tmp_path / "swarm", chunk_size=8 * MiB,
                                  data={"toy": f"file://{source}"}, list_ttl=1.0)  # fmt: skip
    try:
        local.start()
        local.wait_ready(timeout=60)
        (tmp_path / "m").mkdir()
        # the kernel keeps sizes far longer than the listing stays current: opens see the new
        # revision while the kernel still holds the old size (and pages)
        with _mount(local, tmp_path / "m", "--root", "data", "--attr-timeout", "600", "--driver", driver) as point:
            assert os.statvfs(point).f_flag & os.ST_RDONLY  # a dataset mount is read-only
            for _ in range(2):  # the second read from the kernel's pages
                for path, data in old.items():
                    assert (point / "toy" / path.name).read_bytes() == data
            for path, data in new.items():
                _replace(path, data, time.time())
            deadline = time.monotonic() + 30
            while True:
                seen = {path: (point / "toy" / path.name).read_bytes() for path in new}
                for path, data in seen.items():
                    assert data in (old[path], new[path]), f"{path.name}: {len(data)} bytes, neither version"
                if seen == new:
                    break
                assert time.monotonic() < deadline, "the changed source was not read"
                time.sleep(0.1)
            assert {path: (point / "toy" / path.name).read_bytes() for path in new} == new
    finally:
        local.close()


@needs_libfuse3
def test_the_low_level_dataset_mount_lists_reads_and_refuses_writes(
    swarm: cacheswarm.CacheSwarm, tmp_path: Path
) -> None:
    with _mount(swarm, tmp_path, "--root", "data/toy", "--driver", "libfuse3") as point:
        names = sorted(os.listdir(point / "train"))
        assert len(names) == 50 and names[0] == "000.txt"
        assert (point / "train" / "007.txt").read_text() == "sample 7\n" * 8
        assert (point / "train" / "049.txt").stat().st_size == len("sample 49\n") * 50
        with open(point / "train" / "010.txt", "rb") as f:
            f.seek(30)
            assert f.read(9) == b"sample 10"
        with pytest.raises(FileNotFoundError):
            (point / "train" / "missing.txt").read_bytes()
        with pytest.raises(OSError) as caught:
            (point / "new.txt").write_text("no")
        assert caught.value.errno == errno.EROFS
        with pytest.raises(OSError) as caught, open(point / "train" / "007.txt", "r+b"):
            pass
        assert caught.value.errno == errno.EROFS


def test_the_low_level_mount_refuses_what_it_cannot_serve(swarm: cacheswarm.CacheSwarm, tmp_path: Path) -> None:
    env = dict(os.environ, **swarm.env_for("node-0"))
    (tmp_path / "m").mkdir()
    done = subprocess.run([sys.executable, "-m", "ringseed.cli", "mount", str(tmp_path / "m"), "--driver", "libfuse3"],
                          env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 2 and "serves datasets only" in done.stderr
    with pytest.raises(ValueError, match="datasets only"):
        datamount.DataMount(spec.RingseedFileSystem(**_sdk(swarm)), "ckpt")


def _sdk(swarm: cacheswarm.CacheSwarm) -> dict[str, str]:
    env = swarm.env_for("node-0")
    return {"socket": env["RINGSEED_CACHE_SOCKET"], "token": env.get("RINGSEED_TOKEN", "")}


@needs_libfuse3
def test_a_warm_pass_costs_no_request_and_a_new_revision_is_told_to_the_kernel(tmp_path: Path) -> None:
    source = tmp_path / "source"
    (source / "d").mkdir(parents=True)
    files = {f"d/{i:02d}.bin": os.urandom(10_000 + i) for i in range(20)}
    for name, data in files.items():
        _replace(source / name, data, time.time() - 100)
    local = cacheswarm.CacheSwarm(nodes=1, workdir=tmp_path / "swarm", chunk_size=8 * MiB,
                                  data={"toy": f"file://{source}"}, list_ttl=1.0)  # fmt: skip
    point = tmp_path / "mnt"
    point.mkdir()
    try:
        local.start()
        local.wait_ready(timeout=60)
        # the kernel keeps names for a day: only the mount's notifications can make it see a change
        server = datamount.DataMount(spec.RingseedFileSystem(**_sdk(local)), "data/toy", threads=4)
        server.start(str(point))
        try:
            for name, data in files.items():
                assert (point / name).read_bytes() == data
            warm = dict(server.calls)
            for name, data in files.items():
                assert (point / name).read_bytes() == data
                assert (point / name).stat().st_size == len(data)
            assert server.calls == warm  # names, attributes, opens, bytes: no callback (isatty's IOCTL: libfuse's)
            if server.capable & libfuse3.CAP_NO_OPEN_SUPPORT:
                assert server.calls["open"] == 1  # answered ENOSYS once: the kernel opens files itself

            kept_ino = (point / "d/00.bin").stat().st_ino
            held = open(point / "d/05.bin", "rb")  # noqa: SIM115 (open across the change: keeps its revision's bytes)
            new = os.urandom(30_000)
            _replace(source / "d/05.bin", new, time.time())
            (source / "d/19.bin").unlink()
            _replace(source / "d/new.bin", b"added", time.time())
            wait_for(lambda: (point / "d/05.bin").read_bytes() == new, within=30, what="the new revision in the kernel")
            assert held.read() == files["d/05.bin"]  # the whole old content, not the new size or bytes
            held.close()
            assert not (point / "d/19.bin").exists()
            assert (point / "d/new.bin").read_bytes() == b"added"
            assert sorted(os.listdir(point / "d")) == sorted([*(n[2:] for n in files if n != "d/19.bin"), "new.bin"])
            assert server.calls["told entry"] >= 2  # the changed file's name and the removed one's
            reads = server.calls["read"]
            assert (point / "d/00.bin").read_bytes() == files["d/00.bin"]
            assert (point / "d/00.bin").stat().st_ino == kept_ino  # the same content keeps its inode
            assert server.calls["read"] == reads  # and its cached pages
        finally:
            server.close()
        assert not os.path.ismount(point)
    finally:
        subprocess.run(["umount", "-l", str(point)], check=False, capture_output=True)
        local.close()

"""Helpers and fixtures for the distribution process tests (master + agents as real processes).

- :func:`make_model`: random files of odd sizes (several files, one nested, one tiny).
- :func:`source_manifest`: the manifest of a local directory, hashed here, to compare every node's
  copy with the source byte for byte (through SHA-256 per chunk).
- ``swarm_factory``: builds :class:`ringseed.local.swarm.LocalSwarm` objects and closes them
  (every child process killed) when the test ends, whatever happens.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ringseed.local import swarm
from ringseed.protocol import manifest

MiB = 1 << 20


def make_model(root: Path, sizes: dict[str, int]) -> Path:
    for rel, size in sizes.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(size))
    return root


def odd_sizes(total_mib: int, *, files: int = 4) -> dict[str, int]:
    """About ``total_mib`` MiB over ``files`` files of odd sizes, plus a nested tiny file."""
    each = total_mib * MiB // files
    sizes = {f"shard-{i:02d}.bin": each + (i * 7919 + 13) * (1 if i % 2 else -1) for i in range(files)}
    sizes["meta/config.json"] = 321
    return sizes


def source_manifest(root: Path, *, chunk_size: int) -> manifest.Manifest:
    entries = [(p.relative_to(root).as_posix(), p.stat().st_size, 0o644) for p in root.rglob("*") if p.is_file()]
    layout = manifest.Layout.build(entries, chunk_size=chunk_size)
    hasher = manifest.ChunkHasher(chunk_size)
    for entry in layout.files:
        with open(root / entry.path, "rb") as f:
            while block := f.read(4 * MiB):
                hasher.update(block)
    return manifest.Manifest(layout=layout, chunk_hashes=tuple(hasher.finish()))


def assert_copies(local: swarm.LocalSwarm, expected: manifest.Manifest, names: list[str] | None = None) -> None:
    """Every named node holds the source's bytes under its model dir, with the right marker."""
    for name in names or local.names:
        assert swarm.verify_copy(local.model_dir(name), expected) == {"complete": True, "verified": True}, name


@pytest.fixture
def swarm_factory(tmp_path: Path) -> Iterator[Callable[..., swarm.LocalSwarm]]:
    made: list[swarm.LocalSwarm] = []

    def factory(**kwargs: Any) -> swarm.LocalSwarm:
        kwargs.setdefault("workdir", tmp_path / f"swarm-{len(made)}")
        local = swarm.LocalSwarm(**kwargs)
        made.append(local)
        return local

    try:
        yield factory
    finally:
        for local in made:
            local.close()

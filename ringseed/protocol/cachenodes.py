"""The cache master's soft state: live cache agents, who holds which chunk, and the duties it hands out.

Owns what the agents can tell a new leader again (they re-register with every chunk they hold),
so it is not replicated: nodes, chunk holders, replica placement, persist duty, which chunks a
node may evict and which it should drop. Pure: no I/O; time is the ``now`` argument.

Rules:
- Nodes register (name, URL, session, group, held chunks) and heartbeat with deltas (chunks
  added and dropped) and their free memory/SSD bytes. A node silent for more than
  ``offline_after`` seconds is purged: it stops counting as a holder and loses its duties.
- Placement (:meth:`Nodes.place`): replicas go to *other* online nodes, those of the writer's
  group first, each writer's replicas on the nodes that follow it in name order (a ring), so
  that when every rank saves at once each node receives about one replica stream. Nodes that
  reported no free bytes are skipped. Fewer candidates than asked is :class:`NotEnoughNodes`
  (the writer fails clearly rather than acknowledge fewer copies than promised).
- Persist duty (with a sink): every unpersisted object is assigned to one online node holding
  the most of its chunks (the writer first); the assignment sticks while that node is online.
- Copy duty (repair): an unpersisted checkpoint object held complete on fewer than ``replicas``
  online nodes (a holder was lost) gets new holders: online nodes that lack a complete copy and
  reported free bytes, chosen as in placement (the writer's group first, the ring after the
  writer), each told to pull the whole object from the remaining holders. The targets stick
  while they are online and the object still lacks copies; every chunk needs an online holder.
  A new leader gives no copy duty until its nodes have re-registered (``replicas=0``).
- Evictable chunks: a node may drop a chunk only when every object that refers to it is
  persisted (the sink has a copy). Replies carry the changes to each node's evictable set.
- Orphans: a chunk a node holds that no object refers to for ``orphan_grace`` seconds (a write
  that never committed, a deleted checkpoint) is listed in ``drop``; dataset chunks whose hash
  the master learned (``keep``) are not orphans.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from ringseed.protocol import cachelog
from ringseed.protocol import cacheobjects as objects


class UnknownNode(cachelog.MetaError):
    code = "unknown_node"


class NotEnoughNodes(cachelog.MetaError):
    code = "not_enough_nodes"


@dataclass
class CacheNode:
    name: str
    url: str
    session: str
    group: str
    last_seen: float
    chunks: set[str] = field(default_factory=set)
    free_bytes: int = 0
    evictable: set[str] = field(default_factory=set)  # what this node was told it may evict
    orphan_since: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Duties:
    """What a heartbeat tells a node to do."""

    persist: list[tuple[str, int]]  # (path, version) to upload to the sink
    copy: list[tuple[str, int]]  # (path, version) to pull a complete copy of (a holder was lost)
    evictable_add: list[str]
    evictable_remove: list[str]
    drop: list[str]


class Nodes:
    """Live cache agents and the chunks they hold."""

    def __init__(self, *, offline_after: float, orphan_grace: float = 600.0) -> None:
        self.offline_after = offline_after
        self.orphan_grace = orphan_grace
        self.nodes: dict[str, CacheNode] = {}
        self.holders: dict[str, set[str]] = {}
        self.persist_owner: dict[str, str] = {}  # path -> node
        self.copy_targets: dict[str, tuple[int, set[str]]] = {}  # path -> (version, nodes pulling a copy)
        self._safe: tuple[int, set[str], set[str]] = (-1, set(), set())  # (seq, evictable, referenced)

    # -- membership ------------------------------------------------------------------------

    def register(
        self, *, name: str, url: str, session: str, group: str, chunks: Iterable[str], free_bytes: int, now: float
    ) -> None:
        """(Re)register ``name`` with everything it holds; replaces any earlier record."""
        self._forget(name)
        node = CacheNode(name=name, url=url, session=session, group=group, last_seen=now, free_bytes=free_bytes)
        self.nodes[name] = node
        self._add(node, chunks)

    def heartbeat(
        self,
        *,
        name: str,
        now: float,
        added: Iterable[str],
        dropped: Iterable[str],
        free_bytes: int,
        meta: cachelog.Metadata,
        sink: bool,
        keep: frozenset[str] | set[str] = frozenset(),
        replicas: int = 0,
    ) -> Duties:
        """A node's news; ``keep``: chunks that are referenced although no object names them (datasets);
        ``replicas``: copies each unpersisted checkpoint should have (0: give no copy duties)."""
        node = self.nodes.get(name)
        if node is None:
            raise UnknownNode(f"node {name!r} is not registered (master restarted or purged it); register again")
        node.last_seen = now
        node.free_bytes = free_bytes
        for sha in dropped:
            node.chunks.discard(sha)
            node.evictable.discard(sha)
            node.orphan_since.pop(sha, None)
            holders = self.holders.get(sha)
            if holders is not None:
                holders.discard(name)
                if not holders:
                    del self.holders[sha]
        self._add(node, added)
        return self._duties(node, meta=meta, sink=sink, now=now, keep=keep, replicas=replicas)

    def hold(self, name: str, chunks: Iterable[str]) -> None:
        """``name`` holds ``chunks`` now (a commit names the nodes that acknowledged them)."""
        node = self.nodes.get(name)
        if node is not None:
            self._add(node, chunks)

    def _add(self, node: CacheNode, chunks: Iterable[str]) -> None:
        for sha in chunks:
            node.chunks.add(sha)
            self.holders.setdefault(sha, set()).add(node.name)

    def _forget(self, name: str) -> None:
        node = self.nodes.pop(name, None)
        if node is None:
            return
        for sha in node.chunks:
            holders = self.holders.get(sha)
            if holders is not None:
                holders.discard(name)
                if not holders:
                    del self.holders[sha]
        for path in [p for p, owner in self.persist_owner.items() if owner == name]:
            del self.persist_owner[path]
        for _, targets in self.copy_targets.values():
            targets.discard(name)

    def purge(self, *, now: float) -> list[str]:
        """Forget nodes silent for more than ``offline_after``; returns their names."""
        gone = [n.name for n in self.nodes.values() if now - n.last_seen > self.offline_after]
        for name in gone:
            self._forget(name)
        return gone

    def online(self, name: str) -> CacheNode:
        node = self.nodes.get(name)
        if node is None:
            raise UnknownNode(f"node {name!r} is not registered (master restarted or purged it); register again")
        return node

    # -- placement and holders -------------------------------------------------------------------

    def place(self, *, writer: str, count: int, exclude: Iterable[str] = ()) -> list[CacheNode]:
        """``count`` replica nodes for a write from ``writer``, none of ``exclude`` (see the module rules)."""
        if count <= 0:
            return []
        me = self.online(writer)
        skip = {writer, *exclude}
        others = sorted(
            (n for n in self.nodes.values() if n.name not in skip and n.free_bytes > 0), key=lambda n: n.name
        )
        ring = [n for n in others if n.name > writer] + [n for n in others if n.name < writer]
        ordered = [n for n in ring if n.group == me.group] + [n for n in ring if n.group != me.group]
        if len(ordered) < count:
            raise NotEnoughNodes(
                f"{count + 1} copies asked (replicas) but only {len(ordered)} other node(s) with free cache are online"
            )
        return ordered[:count]

    def holders_of(self, sha: str, *, exclude: str = "") -> list[CacheNode]:
        """Online nodes holding chunk ``sha`` (not ``exclude``), in name order."""
        names = sorted(self.holders.get(sha, ()))
        return [self.nodes[n] for n in names if n != exclude and n in self.nodes]

    def copies(self, meta: objects.ObjectMeta) -> int:
        """How many online nodes hold every chunk of ``meta``."""
        return len(self._complete_holders(meta)) if meta.chunks else len(self.nodes)

    # -- duties --------------------------------------------------------------------------------

    def _duties(
        self,
        node: CacheNode,
        *,
        meta: cachelog.Metadata,
        sink: bool,
        now: float,
        keep: frozenset[str] | set[str],
        replicas: int,
    ) -> Duties:
        evictable, referenced = self._safe_sets(meta)
        held_safe = node.chunks & evictable
        add = sorted(held_safe - node.evictable)
        remove = sorted(node.evictable - held_safe)
        node.evictable = held_safe
        drop = []
        for sha in node.chunks:
            if sha in referenced or sha in keep:
                node.orphan_since.pop(sha, None)
                continue
            since = node.orphan_since.setdefault(sha, now)
            if now - since >= self.orphan_grace:
                drop.append(sha)
        persist = self.assign_persist(meta, now=now) if sink else {}
        mine = sorted((path, meta.objects[path].version) for path, owner in persist.items() if owner == node.name)
        copies = self.assign_copies(meta, replicas=replicas) if replicas > 1 else {}
        pull = sorted((path, version) for path, (version, targets) in copies.items() if node.name in targets)
        return Duties(persist=mine, copy=pull, evictable_add=add, evictable_remove=remove, drop=sorted(drop))

    def _safe_sets(self, meta: cachelog.Metadata) -> tuple[set[str], set[str]]:
        """(chunks whose every referring object is persisted, chunks referred to), cached per seq."""
        seq, safe, referenced = self._safe
        if seq == meta.seq:
            return safe, referenced
        unsafe: set[str] = set()
        referenced = set()
        for obj in meta.objects.values():
            for chunk in obj.chunks:
                referenced.add(chunk.sha256)
                if not obj.persisted:
                    unsafe.add(chunk.sha256)
        safe = referenced - unsafe
        self._safe = (meta.seq, safe, referenced)
        return safe, referenced

    def assign_persist(self, meta: cachelog.Metadata, *, now: float) -> dict[str, str]:
        """Unpersisted object path -> the online node that uploads it (sticky while it is online)."""
        wanted = {p: m for p, m in meta.objects.items() if not m.persisted and not objects.is_data(p)}
        for path in [p for p in self.persist_owner if p not in wanted]:
            del self.persist_owner[path]
        for path, obj in wanted.items():
            owner = self.persist_owner.get(path)
            if owner in self.nodes:
                continue
            best = self._best_holder(obj)
            if best is not None:
                self.persist_owner[path] = best
        return dict(self.persist_owner)

    def assign_copies(self, meta: cachelog.Metadata, *, replicas: int) -> dict[str, tuple[int, set[str]]]:
        """Under-replicated unpersisted object path -> (version, the online nodes that pull a copy)."""
        kept: dict[str, tuple[int, set[str]]] = {}
        for path, obj in meta.objects.items():
            if obj.persisted or objects.is_data(path) or not obj.chunks:
                continue
            complete = self._complete_holders(obj)
            if len(complete) >= replicas or any(not self.holders.get(c.sha256) for c in obj.chunks):
                continue
            version, targets = self.copy_targets.get(path, (obj.version, set()))
            if version != obj.version:
                targets = set()
            targets = {t for t in targets if t in self.nodes and t not in complete}
            missing = replicas - len(complete) - len(targets)
            if missing > 0:
                targets |= set(self._copy_candidates(obj, holders=complete, skip=complete | targets)[:missing])
            if targets:
                kept[path] = (obj.version, targets)
        self.copy_targets = kept
        return kept

    def _complete_holders(self, obj: objects.ObjectMeta) -> set[str]:
        common: set[str] | None = None
        for chunk in obj.chunks:
            have = self.holders.get(chunk.sha256, set())
            common = set(have) if common is None else common & have
            if not common:
                return set()
        return {n for n in common or () if n in self.nodes}

    def _copy_candidates(self, obj: objects.ObjectMeta, *, holders: set[str], skip: set[str]) -> list[str]:
        """Nodes to pull a copy, in placement order: the group of the writer (or of a holder, the writer
        being gone) first, then the ring after the writer."""
        near = self.nodes.get(obj.writer) or next((self.nodes[n] for n in sorted(holders) if n in self.nodes), None)
        group = near.group if near is not None else None
        others = sorted(
            (n for n in self.nodes.values() if n.name not in skip and n.free_bytes > 0), key=lambda n: n.name
        )
        ring = [n for n in others if n.name > obj.writer] + [n for n in others if n.name <= obj.writer]
        return [n.name for n in ring if n.group == group] + [n.name for n in ring if n.group != group]

    def _best_holder(self, obj: objects.ObjectMeta) -> str | None:
        if not self.nodes:
            return None
        load: dict[str, int] = {}
        for owner in self.persist_owner.values():
            load[owner] = load.get(owner, 0) + 1

        def score(name: str) -> tuple[int, int, int, str]:
            held = sum(1 for c in obj.chunks if name in self.holders.get(c.sha256, ()))
            return (-held, 0 if name == obj.writer else 1, load.get(name, 0), name)

        return min(self.nodes, key=score)


def chunk_sources(meta: objects.ObjectMeta, nodes: Nodes, *, exclude: str) -> list[list[tuple[str, str]]]:
    """Per chunk of ``meta``: ``[(node, url)]`` of online holders other than ``exclude``."""
    return [[(n.name, n.url) for n in nodes.holders_of(c.sha256, exclude=exclude)] for c in meta.chunks]


def names(items: Sequence[CacheNode]) -> list[str]:
    return [n.name for n in items]

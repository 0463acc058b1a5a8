"""The numbers ``ringseed local distribute`` shows, from status bodies and a fake clock."""

from __future__ import annotations

import io
from typing import Any

from ringseed.local import display, progress

MiB = 1 << 20
SIZE = 100 * MiB


def status(nodes: dict[str, int], *, origin: int, verified: tuple[str, ...] = (), **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "total_bytes": SIZE,
        "bytes_from_origin": origin,
        "nodes": {n: {"bytes": b, "verified": n in verified, "online": True} for n, b in nodes.items()},
    }
    body["nodes"].update(extra.get("override", {}))
    return body


def feed(p: progress.Progress, samples: list[tuple[float, dict[str, Any]]]) -> progress.View:
    for at, body in samples:
        p.update(body, now=at)
    return p.view(now=samples[-1][0])


def test_bytes_are_per_node_against_the_model_size_and_done_nodes_count_as_they_finish() -> None:
    p = progress.Progress(names=["a", "b"], started=0.0)
    view = feed(p, [(1.0, status({"a": SIZE, "b": 10 * MiB}, origin=SIZE, verified=("a",)))])
    assert [(r.name, r.bytes, r.total, r.state) for r in view.nodes] == [
        ("a", SIZE, SIZE, "verified"),
        ("b", 10 * MiB, SIZE, "fetching"),
    ]
    assert view.verified == 1
    assert "nodes 1/2 verified" in display.cluster_line(view)
    assert "(2 x 100.0 MiB)" in display.cluster_line(view)


def test_eta_follows_the_origin_rate_when_the_origin_is_the_bottleneck() -> None:
    # Peers keep up with the origin-duty node, so the swarm looks fast; the origin caps it.
    p = progress.Progress(names=["a", "b"], started=0.0, rate_limit=10 * MiB)
    view = feed(
        p,
        [
            (0.0, status({"a": 0, "b": 0}, origin=0)),
            (2.0, status({"a": 20 * MiB, "b": 20 * MiB}, origin=20 * MiB)),
        ],
    )
    assert view.origin_rate == 10 * MiB
    assert view.eta == 8.0  # 80 MiB nobody holds yet at 10 MiB/s
    assert view.eta_text == "8s"


def test_the_rate_limit_caps_a_measured_origin_burst() -> None:
    p = progress.Progress(names=["a"], started=0.0, rate_limit=10 * MiB)
    view = feed(p, [(0.0, status({"a": 0}, origin=0)), (1.0, status({"a": 40 * MiB}, origin=40 * MiB))])
    assert view.eta == 6.0  # 60 MiB at the 10 MiB/s cap, not at the 40 MiB/s burst


def test_eta_is_the_swarm_bound_once_the_origin_has_been_read() -> None:
    p = progress.Progress(names=["a", "b"], started=0.0)
    view = feed(
        p,
        [
            (0.0, status({"a": SIZE, "b": 0}, origin=SIZE)),
            (4.0, status({"a": SIZE, "b": 40 * MiB}, origin=SIZE)),
        ],
    )
    assert view.eta == 6.0  # 60 MiB missing on b at 10 MiB/s


def test_no_progress_reads_stalled_never_zero() -> None:
    p = progress.Progress(names=["a", "b"], started=0.0, stall_after=10.0)
    stuck = status({"a": 30 * MiB, "b": 30 * MiB}, origin=30 * MiB)
    feed(p, [(0.0, status({"a": 0, "b": 0}, origin=0)), (1.0, stuck)])
    assert p.view(now=5.0).eta_text != "0s"
    for at in (6.0, 11.0, 16.0):
        p.update(stuck, now=at)
    view = p.view(now=16.0)
    assert view.eta_text == "stalled 15s"
    assert "ETA stalled 15s" in display.cluster_line(view)


def test_eta_is_unknown_before_two_samples_and_done_at_the_end() -> None:
    p = progress.Progress(names=["a"], started=0.0)
    assert feed(p, [(0.5, status({"a": 0}, origin=0))]).eta_text == "?"
    done = feed(p, [(3.0, status({"a": SIZE}, origin=SIZE, verified=("a",)))])
    assert done.eta_text == "done" and done.stalled_for == 0.0


def test_a_reported_problem_is_the_node_state() -> None:
    p = progress.Progress(names=["a", "b"], started=0.0)
    body = status({"a": 0, "b": 0}, origin=0)
    body["nodes"]["a"].update(reason="OriginError", message="file:///m: no such file or directory")
    body["nodes"]["b"]["online"] = False
    view = feed(p, [(1.0, body)])
    assert [(r.state, r.message) for r in view.nodes] == [
        ("OriginError", "file:///m: no such file or directory"),
        ("offline", ""),
    ]


def test_plain_lines_have_no_carriage_return_and_report_each_node_event_once() -> None:
    out = io.StringIO()
    lines = display.Lines(out, every=5.0)
    p = progress.Progress(names=["a", "b"], started=0.0)
    for at, body in [
        (0.0, status({"a": 0, "b": 0}, origin=0)),
        (1.0, status({"a": SIZE, "b": 0}, origin=SIZE, verified=("a",))),
        (2.0, status({"a": SIZE, "b": 50 * MiB}, origin=SIZE, verified=("a",))),
        (6.0, status({"a": SIZE, "b": SIZE}, origin=SIZE, verified=("a", "b"))),
    ]:
        p.update(body, now=at)
        lines.show(p.view(now=at))
    lines.close(p.view(now=6.0))
    text = out.getvalue()
    assert "\r" not in text
    assert text.count("a: 100.0 MiB/100.0 MiB (100%) verified") == 1
    assert text.count("b: 100.0 MiB/100.0 MiB (100%) verified") == 1
    assert text.splitlines()[-1].split()[1:4] == ["nodes", "2/2", "verified"]


def test_format_seconds() -> None:
    assert [progress.format_seconds(s) for s in (0, 0.2, 59, 60, 185, 7620)] == [
        "0s",
        "1s",
        "59s",
        "1m00s",
        "3m05s",
        "2h07m",
    ]

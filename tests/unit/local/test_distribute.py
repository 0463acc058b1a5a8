"""Decisions of ``ringseed local distribute`` that need no processes."""

from __future__ import annotations

from ringseed.local import distribute


def test_a_node_with_a_permanent_problem_stops_the_run_naming_it() -> None:
    status = {
        "nodes": {
            "node-0": {"reason": None},
            "node-1": {"reason": "PeerUnreachable", "message": "peers gone"},
            "node-2": {"reason": "OriginError", "message": "s3://b/m/: gave up after 8 retries: HTTP 503"},
        }
    }
    assert distribute.permanent_problem(status) == "node-2: OriginError: s3://b/m/: gave up after 8 retries: HTTP 503"


def test_passing_problems_and_no_problems_go_on() -> None:
    assert distribute.permanent_problem({"nodes": {"node-0": {"reason": "DiskFull", "message": "full"}}}) is None
    assert distribute.permanent_problem({"nodes": {"node-0": {"chunks": 3}}}) is None
    assert distribute.permanent_problem({}) is None


def test_lower_bound_is_the_origin_time_plus_a_chunk_per_doubling() -> None:
    assert distribute.lower_bound(size=64 << 20, rate=None, chunk_size=4 << 20, nodes=8) is None
    assert distribute.lower_bound(size=64 << 20, rate=8 << 20, chunk_size=4 << 20, nodes=8) == 8.0 + 0.5 * 3

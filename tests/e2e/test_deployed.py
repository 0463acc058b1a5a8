"""The whole system as a user deploys it (issue 10): the chart's operator and the objects it writes,
run as podman containers from the project's image on an emulated 4-node cluster with shaped links.

One cluster for the module; the steps run in order and each asserts what a user relies on:
install -> distribute (phases, kubectl columns, byte-identical copies, origin read once, master and
agent killed mid-run) -> train (waits for the model, verified nodes only, DDP losses match one
process) -> a node's link cut -> a source change -> delete with Retain and Delete.
Root only (network namespaces, podman); the skip says why.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import hashlib
import json
import os
import shutil
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import yaml

from ringseed.agent import store
from ringseed.api import constants
from ringseed.operator import builders
from ringseed.testbed import netns
from tests.conftest import REPO
from tests.e2e import images
from tests.e2e.cluster import deployed as deployed_module
from tests.e2e.cluster import kubelet
from tests.e2e.cluster.process import run_process

REASON = netns.can_run() or images.cannot_build() or deployed_module.missing_tools()
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.image,
    pytest.mark.skipif(REASON is not None, reason=str(REASON)),
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.timeout(900),
]
NS = "default"
MD = "tiny-model"
EXAMPLES = REPO / "examples"
FIGURES: dict[str, Any] = {}
MOVING = ("Downloading", "Distributing")  # the phases of a distribution under way (DESIGN.md)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def env(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[deployed_module.Deployed]:
    started = time.monotonic()
    built = images.ensure()
    FIGURES["image_seconds"] = round(built.seconds, 1)
    FIGURES["image_sizes_mb"] = {tag: round(size / 1e6) for tag, size in built.sizes.items()}
    async with deployed_module.deployed(tmp_path_factory.mktemp("cluster"), image_ids=built.ids) as env:
        yield env
    FIGURES["e2e_seconds"] = round(time.monotonic() - started, 1)
    print("\nE2E FIGURES " + json.dumps(FIGURES, sort_keys=True))
    if os.environ.get("RINGSEED_E2E_FIGURES"):  # a file for the figures too (a CI run without -s)
        text = json.dumps(FIGURES, sort_keys=True, indent=1) + "\n"
        await asyncio.to_thread(Path(os.environ["RINGSEED_E2E_FIGURES"]).write_text, text)


def md(env: deployed_module.Deployed, name: str = MD) -> dict[str, Any]:
    return env.cluster.get("modeldistributions", NS, name) or {}


def phase(obj: dict[str, Any]) -> str | None:
    return obj.get("status", {}).get("phase")


def pods(env: deployed_module.Deployed, owner: str, namespace: str = NS) -> list[dict[str, Any]]:
    return env.cluster.pods_of(namespace, owner)


def ready_runtimes(env: deployed_module.Deployed, owner: str, namespace: str = NS) -> list[kubelet.PodRuntime]:
    found = [env.cluster.runtimes.get(p["metadata"]["uid"]) for p in pods(env, owner, namespace)]
    return [r for r in found if r is not None and r.ready()]


def origin_files(env: deployed_module.Deployed) -> Path:
    (runtime,) = ready_runtimes(env, "model-origin")
    return runtime.pod_dir / "model"


def tree_digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.name.startswith(".") and p.name != "index.json"
    }


def node_copy(env: deployed_module.Deployed, node: str, name: str = MD) -> Path:
    return env.cluster.node_path(node, f"/var/lib/ringseed/models/{NS}/{name}")


async def metrics(env: deployed_module.Deployed, runtime: kubelet.PodRuntime, md_name: str) -> dict[str, float]:
    """An agent's ``/metrics`` (with its group's token, from the ``<name>-token`` Secret)."""
    secret = env.cluster.get("secrets", NS, f"{md_name}-token")
    assert secret is not None
    token = base64.b64decode(secret["data"][constants.TOKEN_KEY]).decode()
    net = runtime.net
    status, body = await kubelet.http_get_in(net.netns, net.address, constants.AGENT_PORT, "/metrics", token=token)
    assert status == 200, body[:200]
    values = {}
    for line in body.decode().splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


async def origin_stats(env: deployed_module.Deployed) -> dict[str, int]:
    (runtime,) = ready_runtimes(env, "model-origin")
    status, body = await kubelet.http_get_in(runtime.net.netns, runtime.net.address, 8080, "/-/stats")
    assert status == 200
    stats: dict[str, int] = json.loads(body)
    return stats


async def test_install_runs_the_operator_from_the_chart(env: deployed_module.Deployed) -> None:
    rendered = deployed_module.helm_template(
        f"image.repository={deployed_module.IMAGE_REPOSITORY}",
        f"image.tag={deployed_module.IMAGE_TAG}",
        "operator.statusIntervalSeconds=1",
    )
    await env.apply(rendered)
    kinds = sorted({doc["kind"] for doc in yaml.safe_load_all(rendered) if doc})
    assert {"ClusterRole", "ConfigMap", "Deployment", "ServiceAccount"} <= set(kinds)
    await env.wait_for(
        lambda: ready_runtimes(env, "ringseed-operator", deployed_module.OPERATOR_NS),
        within=120,
        what="the operator pod to run",
    )
    (operator,) = ready_runtimes(env, "ringseed-operator", deployed_module.OPERATOR_NS)
    (container,) = operator.plan.containers
    assert container.env["RINGSEED_IMAGE"] == "ringseed:dev"  # from the chart's ConfigMap
    assert container.env["KUBERNETES_SERVICE_HOST"] == env.net.control_address
    assert "--read-only" in container.args and "--cap-drop=all" in container.args
    assert env.kmock.denied == []  # the chart's RBAC covers what the operator did so far


async def test_distribution_completes_while_a_training_group_waits(env: deployed_module.Deployed) -> None:
    await env.apply((EXAMPLES / "cluster" / "model-origin.yaml").read_text())
    await env.wait_for(lambda: ready_runtimes(env, "model-origin"), within=120, what="the HTTP origin")
    source = origin_files(env)
    expected = await env.wait_for(
        lambda: (source / "index.json").exists() and tree_digest(source), within=60, what="the origin's model"
    )
    total = sum((source / path).stat().st_size for path in expected)
    phases: list[str] = []
    applied, applied_at = time.monotonic(), time.time()
    await env.apply((EXAMPLES / "cluster" / "modeldistribution-http.yaml").read_text())

    agents_ready: list[float] = []

    def record() -> bool:
        now = phase(md(env))
        if now and (not phases or phases[-1] != now):
            phases.append(now)
        if not agents_ready and len(ready_runtimes(env, f"{MD}-agent")) == 4:
            agents_ready.append(time.monotonic() - applied)
        return now == "Complete"

    recorder = asyncio.create_task(env.wait_for(record, within=300, what="phase Complete"))
    await env.wait_for(
        lambda: phase(md(env)) in MOVING and md(env)["status"].get("percent", 0) >= 10,
        within=120,
        what="Downloading or Distributing, at 10%",
    )
    table = await env.kubectl("get", "md", MD)
    header, row = table.splitlines()[:2]
    assert header.split() == ["NAME", "PHASE", "READY", "TOTAL", "PERCENT", "THROUGHPUT", "ETA", "AGE"]
    cells = row.split()
    assert cells[0] == MD and cells[1] in MOVING and cells[3] == "4", table
    FIGURES["kubectl_get_md_while_running"] = table.strip()

    await env.create_config_map("ddp-train", EXAMPLES / "ddp_train.py")
    await env.apply((EXAMPLES / "cluster" / "traininggroup-ddp.yaml").read_text())
    waiting = await env.wait_for(
        lambda: (tg := env.cluster.get("traininggroups", NS, "tiny-train")) and phase(tg) and tg,
        within=60,
        what="the TrainingGroup's first status",
    )
    if phase(md(env)) != "Complete":
        assert phase(waiting) == "WaitingForModel", waiting.get("status")
        assert not pods(env, "tiny-train-worker")

    await recorder
    FIGURES["apply_to_complete_seconds"] = round(time.monotonic() - applied, 2)
    FIGURES["apply_to_complete_steps"] = await steps(env, MD, since=applied_at, complete=time.time())
    FIGURES["apply_to_all_agents_ready_seconds"] = round(agents_ready[0], 2) if agents_ready else None
    FIGURES["phases"] = phases
    assert phases[0] == "Pending" and phases[-1] == "Complete", phases
    assert set(phases[1:-1]) & set(MOVING), phases
    for node in env.net.node_names():
        assert tree_digest(node_copy(env, node)) == expected, f"copy on {node} differs from the source"
    stats = await origin_stats(env)
    FIGURES["origin_bytes_over_model"] = round(stats["bytes"] / total, 3)
    assert stats["bytes"] <= 1.1 * total, f"the origin sent {stats['bytes']} bytes for a {total}-byte model"
    status = md(env)["status"]
    assert status["nodesReady"] == status["nodesTotal"] == 4
    FIGURES["local_distribute_seconds"] = await local_distribute_seconds(env, source)


async def steps(env: deployed_module.Deployed, name: str, *, since: float, complete: float) -> dict[str, Any]:
    """Where the time from ``kubectl apply`` to Complete went, in seconds after the apply.

    The harness records when it saw each object and what each pod went through (kubelet
    ``timeline``: podman run called and returned, exits, ready); the agents' own log lines say when
    each served its port, held the revision (registered, the layout known) and got a first chunk.
    For the pods of a DaemonSet the value is the last of the four (the run waits for all)."""

    def at(stamp: float | None) -> float | None:
        return round(stamp - since, 2) if stamp is not None else None

    def seen(resource: str, obj: str) -> float | None:
        return at(env.cluster.informers[resource].seen.get((NS, obj)))

    def last(runtimes: list[kubelet.PodRuntime], event: str) -> float | None:
        stamps = [r.timeline.get(event) for r in runtimes]
        return at(max(s for s in stamps if s is not None)) if stamps and None not in stamps else None

    def first(runtimes: list[kubelet.PodRuntime], event: str) -> float | None:
        stamps = [s for s in (r.timeline.get(event) for r in runtimes) if s is not None]
        return at(min(stamps)) if stamps else None

    master = [env.cluster.runtime_of(p) for p in pods(env, f"{name}-master")]
    agents = [env.cluster.runtime_of(p) for p in pods(env, f"{name}-agent")]
    logged: dict[str, list[float]] = {"serving": [], "revision": [], "first_chunk": []}
    for runtime in agents:
        lines = (await runtime.logs("agent", tail=10**6)).splitlines()
        for key, marker in (
            ("serving", "serving chunks at"),
            ("revision", "Holding revision"),
            ("first_chunk", "Chunk "),
        ):
            stamp = next((log_time(line) for line in lines if marker in line), None)
            if stamp is not None:
                logged[key].append(stamp)
    out: dict[str, Any] = {
        "operator_saw_it": seen("modeldistributions", name),  # kubectl apply returned and the watch event came
        "master_deployment": seen("deployments", f"{name}-master"),  # the operator's create handler made it
        "agent_daemonset": seen("daemonsets", f"{name}-agent"),
        "master_pod_started": last(master, "pod"),
        "master_podman_run": [last(master, "master:run"), last(master, "master:running")],
        "master_ready": first(master, "ready"),  # the leader; a follower replica is never ready
        "agent_pods_started": last(agents, "pod"),
        "agent_init_container": [last(agents, "prepare-dirs:run"), last(agents, "prepare-dirs:exited")],
        "agent_podman_run": [last(agents, "agent:run"), last(agents, "agent:running")],
        "agents_ready": last(agents, "ready"),
        "complete": at(complete),
    }
    for key, stamps in logged.items():
        out[f"agents_{key}"] = at(max(stamps)) if len(stamps) == len(agents) else None
    return out


def log_time(line: str) -> float | None:
    """The epoch time of a ``ringseed`` log line (``2026-01-02 03:04:05,678 INFO ...``, UTC in the image)."""
    try:
        stamp = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
    except ValueError:
        return None
    return stamp.replace(tzinfo=datetime.UTC).timestamp()


async def local_distribute_seconds(env: deployed_module.Deployed, source: Path) -> float:
    """The same model, chunk size, origin rate and node count, cluster-free (``ringseed local distribute``)."""
    spec = yaml.safe_load((EXAMPLES / "cluster" / "modeldistribution-http.yaml").read_text())["spec"]
    copy = env.work / "local-source"
    copy.mkdir(exist_ok=True)
    for path in tree_digest(source):
        (copy / path).write_bytes((source / path).read_bytes())
    args = [sys.executable, "-m", "ringseed.cli", "local", "distribute", f"file://{copy}", "--nodes", "4",
            "--chunk-size", spec["chunkSize"], "--origin-rate-limit", spec["originRateLimit"],
            "--seeders", str(spec["seeders"]), "--workdir", str(env.work / "local"), "--json"]  # fmt: skip
    seconds: float = json.loads(await run(*args))["seconds"]
    return round(seconds, 2)


async def test_training_waits_then_runs_ddp_on_verified_nodes(env: deployed_module.Deployed) -> None:
    await env.wait_for(  # applied while the model was on its way (previous step)
        lambda: len(ready_runtimes(env, "tiny-train-worker")) == 4, within=240, what="4 training workers"
    )
    key, value = builders.model_node_label(namespace=NS, name=MD)
    for pod in pods(env, "tiny-train-worker"):
        node = env.cluster.get("nodes", "", pod["spec"]["nodeName"])
        assert node is not None and node["metadata"]["labels"].get(key) == value, node
        mounts = {target: ro for _, target, ro in env.cluster.runtime_of(pod).plan.containers[0].mounts}
        assert mounts[f"/models/{MD}"] is True  # the model, read-only

    async def results() -> list[dict[str, Any]]:
        found = []
        for runtime in ready_runtimes(env, "tiny-train-worker"):
            lines = [line for line in (await runtime.logs("train", tail=10**6)).splitlines() if line.startswith("{")]
            found += [json.loads(line) for line in lines[-1:]]
        return found

    deadline = time.monotonic() + 600  # four torch processes start and train on 2 shared cores
    while len(found := await results()) < 4:
        assert time.monotonic() < deadline, f"training did not finish: {found}"
        assert not env.cluster.errors, env.cluster.errors
        await asyncio.sleep(1)
    reference = await single_process_losses(env)
    assert sorted(r["rank"] for r in found) == [0, 1, 2, 3] and {r["world"] for r in found} == {4}
    for result in found:
        assert result["losses"] == pytest.approx(reference, rel=1e-4), (result, reference)
    FIGURES["ddp_losses"] = reference


async def single_process_losses(env: deployed_module.Deployed) -> list[float]:
    """The same script as one process (no group), on node0's copy of the model."""
    model, script = node_copy(env, "node0"), EXAMPLES / "ddp_train.py"
    image = env.cluster.image_ids[images.TAGS["training"]]
    out = await run(
        *images.PODMAN, "run", "--rm", "--network=none", "--read-only",
        f"--mount=type=bind,source={model},destination=/model,ro=true",
        f"--mount=type=bind,source={script},destination=/app/ddp_train.py,ro=true",
        "--entrypoint=python", image, "/app/ddp_train.py", "--single", "/model",
    )  # fmt: skip
    losses: list[float] = json.loads(out.strip().splitlines()[-1])["losses"]
    return losses


async def run(*args: str) -> str:
    """Run a command to completion without blocking the event loop (the emulator serves from it)."""
    done = await run_process(*args, within=300)
    assert done.returncode == 0, f"{args[:4]} exited {done.returncode}: {done.err.decode()[-2000:]}"
    return done.out.decode()


def share_the_model(env: deployed_module.Deployed) -> dict[str, str]:
    """Put the origin's model on every node at /srv/models/tiny-model (the share file-model reads).

    Each node gets its own copy with the files' times, as a share shows the same files to every
    node (NFS; a bucket's FUSE mount, whose inode numbers differ per node) or as ``rsync -a`` copies
    them: the agent that takes over origin duty must find the revision another node listed."""
    source = origin_files(env)
    files = tree_digest(source)
    for node in env.net.node_names():
        share = env.cluster.node_path(node, "/srv/models/tiny-model")
        share.mkdir(parents=True, exist_ok=True)
        for path in files:
            shutil.copy2(source / path, share / path)
    return files


def journal(env: deployed_module.Deployed, node: str, name: str) -> list[tuple[int, str | None]]:
    """What ``name``'s agent on ``node`` recorded in its staging journal, in order: each chunk
    verified and made durable (index, hash), each dropped since (index, None)."""
    staging = f"/var/lib/ringseed/models/{NS}/.cache/{NS}/{name}/{store.JOURNAL}"
    return store.journal_entries(env.cluster.node_path(node, staging))


def verified_twice(entries: list[tuple[int, str | None]]) -> set[int]:
    """Chunks journaled as verified more than once: fetched again although the node had them."""
    seen: set[int] = set()
    twice = set()
    for index, digest in entries:
        if digest is not None:
            if index in seen:
                twice.add(index)
            seen.add(index)
    return twice


def busy_nodes(env: deployed_module.Deployed) -> set[str]:
    """Nodes running file-model's master or the operator: a cut there stops everything."""
    owners = [("file-model-master", NS), ("ringseed-operator", deployed_module.OPERATOR_NS)]
    return {p["spec"]["nodeName"] for owner, ns in owners for p in pods(env, owner, ns)}


async def test_file_origin_with_faults_master_killed_agent_killed_link_cut(env: deployed_module.Deployed) -> None:
    name, chunk = "file-model", 4 << 20
    expected = share_the_model(env)
    total = sum((origin_files(env) / path).stat().st_size for path in expected)
    await env.apply((EXAMPLES / "cluster" / "modeldistribution-file.yaml").read_text())

    def at(percent: int) -> Any:
        return env.wait_for(
            lambda: md(env, name).get("status", {}).get("percent", 0) >= percent, within=120, what=f"{name} {percent}%"
        )

    await at(10)
    revision = md(env, name)["status"].get("revision")
    (master,) = ready_runtimes(env, f"{name}-master")
    await master.kill("master")  # the pod restarts it; the transfer goes on without refetching
    await at(25)
    cut = sorted(set(env.net.node_names()) - busy_nodes(env))[-1]
    agents = sorted(ready_runtimes(env, f"{name}-agent"), key=lambda r: r.net.node)
    victim = next(r for r in agents if r.net.node != cut)
    held = (await metrics(env, victim, name))["ringseed_agent_chunks_held"]
    await victim.kill("agent")
    journaled = dict(journal(env, victim.net.node, name))  # what it verified and made durable before it died
    FIGURES["killed_agent_chunks"] = {"held": held, "journaled": len(journaled)}
    env.net.set_link(cut, up=False)

    def degraded_naming_the_cut() -> dict[str, Any] | None:  # (the killed agent may be named first, while it restarts)
        if phase(md(env, name)) != "Degraded":
            return None
        conditions = {c["type"]: c for c in md(env, name)["status"].get("conditions", [])}
        condition = conditions.get("Degraded", {"status": "False"})
        return condition if condition["status"] == "True" and cut in condition.get("message", "") else None

    try:
        condition = await env.wait_for(degraded_naming_the_cut, within=90, what=f"Degraded naming {cut}")
        FIGURES["degraded_condition"] = condition["message"]
    finally:
        env.net.set_link(cut, up=True)
    await env.wait_for(lambda: phase(md(env, name)) == "Complete", within=180, what="Complete after the faults")
    assert master.states["master"].restarts >= 1 and victim.states["agent"].restarts >= 1
    for node in env.net.node_names():
        assert tree_digest(node_copy(env, node, name)) == expected, node
    # One revision throughout (the new duty holder and the restarted master confirmed it from
    # the source), so every node's journal covers the whole run: a chunk verified twice is one
    # fetched again although the node had it (after the master's restart, after the agent's).
    assert md(env, name)["status"].get("revision") == revision
    fetched = {}
    for runtime in ready_runtimes(env, f"{name}-agent"):
        node = runtime.net.node
        assert not verified_twice(journal(env, node, name)), (node, sorted(verified_twice(journal(env, node, name))))
        fetched[node] = (await metrics(env, runtime, name))["ringseed_agent_bytes_fetched"] / total
    # Bytes received, in models (with bodies cut short by the faults): for the record.
    FIGURES["faults_fetched_over_model"] = {node: round(ratio, 3) for node, ratio in sorted(fetched.items())}
    victim_fetched = fetched[victim.net.node] * total
    kept = sum(min(chunk, total - i * chunk) for i in journaled)
    assert victim_fetched <= total - kept + 2 * chunk, (victim_fetched, len(journaled), held)  # resumed, not restarted


async def test_a_new_source_reaches_every_node(env: deployed_module.Deployed) -> None:
    """The user points the ModelDistribution at new content: every node ends with the new bytes."""
    source = origin_files(env)
    old = tree_digest(source)
    fresh = source / "v2"
    fresh.mkdir()
    files = []
    for path in old:  # same names and sizes, other bytes
        size = (source / path).stat().st_size
        (fresh / path).write_bytes(hashlib.shake_256(b"v2/" + path.encode()).digest(size))
        files.append({"path": path, "size": size, "mode": 0o644})
    (fresh / "index.json").write_text(json.dumps({"files": files}))
    new = tree_digest(fresh)
    assert set(new) == set(old) and new != old
    before = md(env)["status"].get("revision")
    uri = yaml.safe_load((EXAMPLES / "cluster" / "modeldistribution-http.yaml").read_text())["spec"]["source"]["uri"]
    patch = json.dumps({"spec": {"source": {"uri": uri + "v2/"}}})
    await env.kubectl("patch", "md", MD, "--type=merge", "-p", patch)

    def everywhere() -> bool:
        try:
            copies_new = all(tree_digest(node_copy(env, node)) == new for node in env.net.node_names())
        except OSError:  # a copy being replaced (published by rename) right now
            return False
        return copies_new and phase(md(env)) == "Complete"

    await env.wait_for(everywhere, within=300, what="the new bytes on every node, and Complete")
    status = md(env)["status"]
    assert status["nodesReady"] == status["nodesTotal"] == 4
    if before is not None:
        assert status.get("revision") != before, status


async def test_delete_with_retain_keeps_and_delete_removes_node_data(env: deployed_module.Deployed) -> None:
    await env.kubectl("delete", "tg", "tiny-train", "--wait=false")
    await env.kubectl("delete", "md", MD, "--wait=false")
    await env.kubectl("delete", "md", "file-model", "--wait=false")
    gone = ("tiny-train-worker", f"{MD}-agent", "file-model-agent", "file-model-cleanup", f"{MD}-master")
    await env.wait_for(
        lambda: not md(env) and not md(env, "file-model") and not any(pods(env, o) for o in gone),
        within=180,
        what="both distributions and their pods gone",
    )
    for node in env.net.node_names():
        assert tree_digest(node_copy(env, node)), f"retainPolicy Retain: the copy on {node} was removed"
        assert not node_copy(env, node, "file-model").exists(), f"retainPolicy Delete: the copy on {node} is left"
    assert env.kmock.denied == [], "the operator needed more than the chart's ClusterRole grants"
    assert env.cluster.errors == []

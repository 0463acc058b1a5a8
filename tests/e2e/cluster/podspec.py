"""What the e2e kubelet makes of a pod spec: every field honoured or a loud error, never dropped.

Owns the translation of a Kubernetes pod (spec + metadata) into ``podman run`` arguments, volume
preparations and probes. Pure: the pod, the objects it refers to (Secrets, ConfigMaps) and the
node's facts come in; plans come out; :mod:`kubelet` carries them out.

Rules:
- Each field of the pod spec, of a container, a volume, a probe or a security context is either in
  the tables below (and honoured as a kubelet would) or :class:`Unsupported` is raised naming it:
  a spec the harness cannot run as written fails the test instead of running differently.
- Environment as the kubelet builds it: ``envFrom`` first, then ``env`` (later wins), then service
  links (``<SVC>_SERVICE_HOST``/``_PORT``, unless ``enableServiceLinks: false``, and always the
  ``kubernetes`` Service's); ``$(VAR)`` in env values, command and args is expanded from the
  variables defined before it, ``$$`` escapes.
- Security: ``runAsUser``/``runAsGroup`` -> ``--user``; ``fsGroup``/``supplementalGroups`` ->
  ``--group-add`` (and the group of Secret, ConfigMap and emptyDir volumes); ``runAsNonRoot`` is
  checked against the user the container would run as; ``readOnlyRootFilesystem`` ->
  ``--read-only`` without podman's extra tmpfs mounts; ``capabilities`` -> ``--cap-drop``/``--cap-add``;
  ``allowPrivilegeEscalation: false`` -> ``no-new-privileges``; seccomp RuntimeDefault is podman's
  default profile.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ringseed.protocol import units

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"

POD_FIELDS = {
    "containers",
    "initContainers",
    "volumes",
    "nodeSelector",
    "tolerations",
    "securityContext",
    "serviceAccountName",
    "serviceAccount",
    "automountServiceAccountToken",
    "enableServiceLinks",
    "terminationGracePeriodSeconds",
    "restartPolicy",
    "imagePullSecrets",
    "dnsPolicy",
    "schedulerName",
    "nodeName",
}
CONTAINER_FIELDS = {
    "name",
    "image",
    "imagePullPolicy",
    "command",
    "args",
    "env",
    "envFrom",
    "ports",
    "readinessProbe",
    "livenessProbe",
    "resources",
    "securityContext",
    "volumeMounts",
    "workingDir",
}
POD_SECURITY_FIELDS = {"runAsUser", "runAsGroup", "runAsNonRoot", "fsGroup", "supplementalGroups", "seccompProfile"}
CONTAINER_SECURITY_FIELDS = {
    "runAsUser",
    "runAsGroup",
    "runAsNonRoot",
    "allowPrivilegeEscalation",
    "readOnlyRootFilesystem",
    "capabilities",
    "privileged",
    "seccompProfile",
}
PROBE_FIELDS = {
    "httpGet",
    "tcpSocket",
    "initialDelaySeconds",
    "periodSeconds",
    "timeoutSeconds",
    "failureThreshold",
    "successThreshold",
}
MOUNT_FIELDS = {"name", "mountPath", "readOnly", "subPath"}
FIELD_PATHS = {
    "metadata.name",
    "metadata.namespace",
    "metadata.uid",
    "spec.nodeName",
    "spec.serviceAccountName",
    "status.podIP",
    "status.hostIP",
}
HOST_PATH_TYPES = {"", "DirectoryOrCreate", "Directory", "FileOrCreate", "File"}


class Unsupported(Exception):
    """A pod spec uses something the e2e kubelet cannot honour; the message names the field."""


class Missing(Exception):
    """A Secret or ConfigMap the pod needs does not exist (yet): the kubelet waits and retries."""


@dataclass(frozen=True)
class NodeFacts:
    """What the kubelet of one node knows when it starts a pod."""

    node: str
    host_ip: str
    node_root: str  # the node's file system: hostPath P is node_root + P
    api_host: str
    api_port: int


@dataclass(frozen=True)
class Volume:
    """A volume prepared on the host at ``host_path`` (relative to the pod's or node's directory)."""

    name: str
    kind: str  # secret, configMap, emptyDir, hostPath, serviceAccount
    files: Mapping[str, tuple[bytes, int]] = field(default_factory=dict)  # secret/configMap: path -> (data, mode)
    host_path: str = ""  # hostPath: the node path; others: filled in by the kubelet
    host_type: str = ""
    size_bytes: int | None = None  # emptyDir sizeLimit
    group: int | None = None  # fsGroup, for secret/configMap/emptyDir


@dataclass(frozen=True)
class Probe:
    kind: str  # http or tcp
    port: int
    path: str
    initial_delay: float
    period: float
    timeout: float
    failures: int
    successes: int


@dataclass(frozen=True)
class ContainerPlan:
    name: str
    image: str
    args: tuple[str, ...]  # podman run options (mounts excluded) + image + command
    mounts: tuple[tuple[str, str, bool], ...]  # (volume name or subpath "vol/sub", mount path, read-only)
    readiness: Probe | None
    liveness: Probe | None
    env: Mapping[str, str]
    stop_timeout: int


@dataclass(frozen=True)
class PodPlan:
    volumes: tuple[Volume, ...]
    init_containers: tuple[ContainerPlan, ...]
    containers: tuple[ContainerPlan, ...]
    cpu_request: float
    memory_request: int


def check_fields(where: str, value: Mapping[str, Any], allowed: set[str]) -> None:
    unknown = sorted(set(value) - allowed)
    if unknown:
        raise Unsupported(f"{where}: field(s) {', '.join(unknown)} not honoured by the e2e kubelet")


def cpu_cores(text: str | int | float) -> float:
    value = str(text)
    return int(value[:-1]) / 1000 if value.endswith("m") else float(value)


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion: defined variables are replaced, ``$$`` is a literal ``$``."""

    def one(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return env.get(name, match.group(0))

    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)", one, text)


@dataclass(frozen=True)
class Inputs:
    """Everything outside the pod that the plan reads."""

    pod: Mapping[str, Any]
    node: NodeFacts
    pod_ip: str
    secrets: Mapping[str, Mapping[str, Any]]  # name -> Secret in the pod's namespace
    config_maps: Mapping[str, Mapping[str, Any]]
    services: Sequence[tuple[str, int, Mapping[str, int]]]  # (name, port, {port name: port}) in the namespace
    image_users: Mapping[str, str]  # image -> its configured USER ("10001:10001", "" = root)
    service_account_token: str | None
    image_ids: Mapping[str, str] = field(default_factory=dict)  # image name -> the ID the node runs for it


def plan(inputs: Inputs) -> PodPlan:
    pod = inputs.pod
    spec = pod["spec"]
    where = f"pod {pod['metadata'].get('namespace')}/{pod['metadata']['name']}"
    check_fields(where, spec, POD_FIELDS)
    if spec.get("restartPolicy", "Always") != "Always":
        raise Unsupported(f"{where}: restartPolicy {spec['restartPolicy']!r} (only Always)")
    if spec.get("dnsPolicy", "ClusterFirst") != "ClusterFirst":
        raise Unsupported(f"{where}: dnsPolicy {spec['dnsPolicy']!r}")
    security = spec.get("securityContext", {})
    check_fields(f"{where} securityContext", security, POD_SECURITY_FIELDS)
    _check_seccomp(where, security)
    volumes = [_volume(where, v, inputs, security) for v in spec.get("volumes", [])]
    if spec.get("automountServiceAccountToken", True) and inputs.service_account_token is not None:
        ca = b""  # filled by the kubelet (the API server's CA)
        namespace = str(pod["metadata"].get("namespace", "default")).encode()
        files = {
            "token": (inputs.service_account_token.encode(), 0o644),
            "namespace": (namespace, 0o644),
            "ca.crt": (ca, 0o644),
        }
        volumes.append(
            Volume(name="kube-api-access", kind="serviceAccount", files=files, group=security.get("fsGroup"))
        )
    by_name = {v.name: v for v in volumes}
    grace = int(spec.get("terminationGracePeriodSeconds", 30))
    inits = tuple(_container(where, c, inputs, by_name, grace) for c in spec.get("initContainers", []))
    mains = tuple(_container(where, c, inputs, by_name, grace) for c in spec["containers"])
    cpu = sum(cpu_cores(c.get("resources", {}).get("requests", {}).get("cpu", 0)) for c in spec["containers"])
    memory = sum(
        units.parse_size(str(c.get("resources", {}).get("requests", {}).get("memory", 0)), syntax=units.Syntax.QUANTITY)
        for c in spec["containers"]
    )
    return PodPlan(
        volumes=tuple(volumes), init_containers=inits, containers=mains, cpu_request=cpu, memory_request=memory
    )


def _check_seccomp(where: str, security: Mapping[str, Any]) -> None:
    profile = security.get("seccompProfile")
    if profile is not None and profile.get("type") not in ("RuntimeDefault", "Unconfined"):
        raise Unsupported(f"{where}: seccompProfile {profile!r} (RuntimeDefault or Unconfined only)")


def _items(
    where: str, source: Mapping[str, Any], data: Mapping[str, bytes], default_mode: int
) -> dict[str, tuple[bytes, int]]:
    items = source.get("items")
    if not items:
        return {key: (value, default_mode) for key, value in data.items()}
    files = {}
    for item in items:
        check_fields(f"{where} items", item, {"key", "path", "mode"})
        if item["key"] not in data:
            raise Missing(f"{where}: key {item['key']!r} not found")
        files[item["path"]] = (data[item["key"]], int(item.get("mode", default_mode)))
    return files


def _volume(where: str, volume: Mapping[str, Any], inputs: Inputs, security: Mapping[str, Any]) -> Volume:
    name = volume["name"]
    kinds = set(volume) - {"name"}
    here = f"{where} volume {name}"
    if len(kinds) != 1 or not kinds <= {"secret", "configMap", "emptyDir", "hostPath"}:
        raise Unsupported(f"{here}: source {sorted(kinds)} (secret, configMap, emptyDir, hostPath only)")
    (kind,) = kinds
    source = volume[kind]
    group = security.get("fsGroup")
    if kind in ("secret", "configMap"):
        check_fields(here, source, {"secretName", "name", "items", "defaultMode", "optional"})
        object_name = source.get("secretName") or source.get("name")
        found = (inputs.secrets if kind == "secret" else inputs.config_maps).get(object_name)
        if found is None:
            if source.get("optional"):
                return Volume(name=name, kind=kind, group=group)
            raise Missing(f"{here}: {kind} {object_name!r} not found")
        data = _data(found, secret=kind == "secret")
        files = _items(here, source, data, int(source.get("defaultMode", 0o644)))
        return Volume(name=name, kind=kind, files=files, group=group)
    if kind == "emptyDir":
        check_fields(here, source, {"sizeLimit", "medium"})
        if source.get("medium", "") not in ("", "Memory"):
            raise Unsupported(f"{here}: medium {source['medium']!r}")
        size = (
            units.parse_size(str(source["sizeLimit"]), syntax=units.Syntax.QUANTITY) if "sizeLimit" in source else None
        )
        return Volume(name=name, kind=kind, size_bytes=size, group=group)
    check_fields(here, source, {"path", "type"})
    if source.get("type", "") not in HOST_PATH_TYPES:
        raise Unsupported(f"{here}: hostPath type {source['type']!r}")
    return Volume(name=name, kind=kind, host_path=source["path"], host_type=source.get("type", ""))


def _data(obj: Mapping[str, Any], *, secret: bool) -> dict[str, bytes]:
    data = {k: (base64.b64decode(v) if secret else str(v).encode()) for k, v in (obj.get("data") or {}).items()}
    data.update({k: str(v).encode() for k, v in (obj.get("stringData") or {}).items()})
    data.update({k: base64.b64decode(v) for k, v in (obj.get("binaryData") or {}).items()})
    return data


def _env(where: str, container: Mapping[str, Any], inputs: Inputs) -> dict[str, str]:
    pod = inputs.pod
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        check_fields(f"{where} envFrom", source, {"secretRef", "configMapRef", "prefix"})
        ref_kind = "secretRef" if "secretRef" in source else "configMapRef"
        ref = source[ref_kind]
        found = (inputs.secrets if ref_kind == "secretRef" else inputs.config_maps).get(ref["name"])
        if found is None:
            if ref.get("optional"):
                continue
            raise Missing(f"{where}: envFrom {ref_kind} {ref['name']!r} not found")
        for key, value in _data(found, secret=ref_kind == "secretRef").items():
            env[source.get("prefix", "") + key] = value.decode()
    fields = {
        "metadata.name": pod["metadata"]["name"],
        "metadata.namespace": pod["metadata"].get("namespace", "default"),
        "metadata.uid": pod["metadata"].get("uid", ""),
        "spec.nodeName": inputs.node.node,
        "spec.serviceAccountName": pod["spec"].get("serviceAccountName", "default"),
        "status.podIP": inputs.pod_ip,
        "status.hostIP": inputs.node.host_ip,
    }
    for item in container.get("env", []):
        check_fields(f"{where} env {item.get('name')}", item, {"name", "value", "valueFrom"})
        env[item["name"]] = _env_value(f"{where} env {item['name']}", item, inputs, fields, env)
    links: dict[str, str] = {
        "KUBERNETES_SERVICE_HOST": inputs.node.api_host,
        "KUBERNETES_SERVICE_PORT": str(inputs.node.api_port),
    }
    if pod["spec"].get("enableServiceLinks", True):
        for name, port, named in inputs.services:
            prefix = name.upper().replace("-", "_")
            links[f"{prefix}_SERVICE_HOST"] = name
            links[f"{prefix}_SERVICE_PORT"] = str(port)
            links.update({f"{prefix}_SERVICE_PORT_{p.upper().replace('-', '_')}": str(n) for p, n in named.items()})
    return {**links, **env}


def _env_value(
    where: str, item: Mapping[str, Any], inputs: Inputs, fields: Mapping[str, str], env: Mapping[str, str]
) -> str:
    if "value" in item:
        return expand(str(item["value"]), env)
    source = item.get("valueFrom", {})
    check_fields(where, source, {"fieldRef", "secretKeyRef", "configMapKeyRef"})
    if "fieldRef" in source:
        path = source["fieldRef"]["fieldPath"]
        if path not in fields:
            raise Unsupported(f"{where}: fieldRef {path!r}")
        return fields[path]
    kind = "secretKeyRef" if "secretKeyRef" in source else "configMapKeyRef"
    ref = source[kind]
    found = (inputs.secrets if kind == "secretKeyRef" else inputs.config_maps).get(ref["name"])
    data = _data(found, secret=kind == "secretKeyRef") if found is not None else {}
    if ref["key"] not in data:
        if ref.get("optional"):
            return ""
        raise Missing(f"{where}: {kind} {ref['name']}/{ref['key']} not found")
    return data[ref["key"]].decode()


def _probe(where: str, probe: Mapping[str, Any] | None, ports: Mapping[str, int]) -> Probe | None:
    if probe is None:
        return None
    check_fields(where, probe, PROBE_FIELDS)
    action = probe.get("httpGet") or probe.get("tcpSocket")
    if action is None:
        raise Unsupported(f"{where}: only httpGet and tcpSocket probes")
    check_fields(where, action, {"path", "port", "scheme"} if "httpGet" in probe else {"port"})
    if action.get("scheme", "HTTP") != "HTTP":
        raise Unsupported(f"{where}: scheme {action['scheme']!r}")
    port = action["port"]
    number = ports[port] if isinstance(port, str) else int(port)
    return Probe(
        kind="http" if "httpGet" in probe else "tcp",
        port=number,
        path=action.get("path", "/"),
        initial_delay=float(probe.get("initialDelaySeconds", 0)),
        period=float(probe.get("periodSeconds", 10)),
        timeout=float(probe.get("timeoutSeconds", 1)),
        failures=int(probe.get("failureThreshold", 3)),
        successes=int(probe.get("successThreshold", 1)),
    )


def _security_args(where: str, container: Mapping[str, Any], inputs: Inputs) -> list[str]:
    pod_security = inputs.pod["spec"].get("securityContext", {})
    security = container.get("securityContext", {})
    check_fields(f"{where} securityContext", security, CONTAINER_SECURITY_FIELDS)
    _check_seccomp(where, security)
    if security.get("privileged"):
        raise Unsupported(f"{where}: privileged containers")
    args: list[str] = []
    user = security.get("runAsUser", pod_security.get("runAsUser"))
    group = security.get("runAsGroup", pod_security.get("runAsGroup"))
    image_user = inputs.image_users.get(container["image"], "")
    if user is not None:
        args.append(f"--user={user}" + (f":{group}" if group is not None else ""))
    elif group is not None:
        raise Unsupported(f"{where}: runAsGroup without runAsUser")
    effective = str(user) if user is not None else (image_user.split(":")[0] or "0")
    if security.get("runAsNonRoot", pod_security.get("runAsNonRoot")) and effective in ("0", "root"):
        raise Unsupported(f"{where}: runAsNonRoot but the container would run as root (kubelet refuses it)")
    for extra in [pod_security.get("fsGroup"), *pod_security.get("supplementalGroups", [])]:
        if extra is not None:
            args.append(f"--group-add={extra}")
    if security.get("readOnlyRootFilesystem"):
        args += ["--read-only", "--read-only-tmpfs=false"]
    capabilities = security.get("capabilities", {})
    check_fields(f"{where} capabilities", capabilities, {"add", "drop"})
    args += [f"--cap-drop={c.lower()}" for c in capabilities.get("drop", [])]
    args += [f"--cap-add={c.lower()}" for c in capabilities.get("add", [])]
    if security.get("allowPrivilegeEscalation") is False:
        args.append("--security-opt=no-new-privileges")
    seccomp = security.get("seccompProfile") or pod_security.get("seccompProfile") or {}
    if seccomp.get("type") == "Unconfined":
        args.append("--security-opt=seccomp=unconfined")
    return args


def _container(
    where: str, container: Mapping[str, Any], inputs: Inputs, volumes: Mapping[str, Volume], grace: int
) -> ContainerPlan:
    here = f"{where} container {container['name']}"
    check_fields(here, container, CONTAINER_FIELDS)
    if container.get("imagePullPolicy", "IfNotPresent") == "Always":
        raise Unsupported(f"{here}: imagePullPolicy Always (no registry can be reached; use IfNotPresent or Never)")
    ports = {}
    for port in container.get("ports", []):
        check_fields(f"{here} port", port, {"name", "containerPort", "protocol"})
        if port.get("protocol", "TCP") != "TCP":
            raise Unsupported(f"{here}: protocol {port['protocol']!r}")
        if "name" in port:
            ports[port["name"]] = int(port["containerPort"])
    resources = container.get("resources", {})
    check_fields(f"{here} resources", resources, {"requests", "limits"})
    for part in ("requests", "limits"):
        check_fields(f"{here} resources.{part}", resources.get(part, {}), {"cpu", "memory"})
    env = _env(here, container, inputs)
    args = []
    for key, value in env.items():
        args.append(f"--env={key}={value}")
    args += _security_args(here, container, inputs)
    limits = resources.get("limits", {})
    if "memory" in limits:
        args.append(f"--memory={units.parse_size(str(limits['memory']), syntax=units.Syntax.QUANTITY)}")
    if "cpu" in limits:
        args.append(f"--cpus={cpu_cores(limits['cpu'])}")
    if "workingDir" in container:
        args.append(f"--workdir={container['workingDir']}")
    mounts = []
    for mount in container.get("volumeMounts", []):
        check_fields(f"{here} volumeMount {mount.get('name')}", mount, MOUNT_FIELDS)
        if mount["name"] not in volumes:
            raise Unsupported(f"{here}: volumeMount of unknown volume {mount['name']!r}")
        volume = volumes[mount["name"]]
        read_only = bool(mount.get("readOnly")) or volume.kind in ("secret", "configMap", "serviceAccount")
        source = mount["name"] + (f"/{mount['subPath']}" if mount.get("subPath") else "")
        mounts.append((source, mount["mountPath"], read_only))
    if "kube-api-access" in volumes:
        mounts.append(("kube-api-access", SERVICE_ACCOUNT_DIR, True))
    command = [expand(part, env) for part in container.get("command", [])]
    run_args = [expand(part, env) for part in container.get("args", [])]
    if command:
        args.append(f"--entrypoint={json.dumps(command)}")
    args += [inputs.image_ids.get(container["image"], container["image"]), *run_args]
    return ContainerPlan(
        name=container["name"],
        image=container["image"],
        args=tuple(args),
        mounts=tuple(mounts),
        readiness=_probe(f"{here} readinessProbe", container.get("readinessProbe"), ports),
        liveness=_probe(f"{here} livenessProbe", container.get("livenessProbe"), ports),
        env=env,
        stop_timeout=grace,
    )

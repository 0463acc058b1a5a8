#!/usr/bin/env bash
# End to end on a real Kubernetes: kind cluster, ringseed image, Helm chart, a model distributed
# over HTTP to every node, and a training group that all-reduces on the nodes holding it.
#
# NOT RUN on the build machines: they have a Docker client without an engine, and kind cannot
# run there. Written with care for a machine with Docker, kind, kubectl and helm on PATH (or in
# .tools/bin); it has not been executed, so expect to adjust small things the first time.
#
# Steps: create a 3-node kind cluster -> docker build (default target) -> kind load -> helm
# install -> an in-cluster HTTP origin that serves a small generated model (index.json + files)
# -> examples/modeldistribution-http.yaml pointed at it -> wait for phase Complete ->
# examples/traininggroup.yaml with the ringseed image as the training image -> wait for Running
# -> examples/modeldistribution-s3.yaml checked by the API server only (dry run; no bucket here).
#
# Env: CLUSTER (default ringseed-e2e), IMAGE (default ringseed:e2e), KEEP=1 keeps the cluster,
#      TIMEOUT (seconds per wait, default 600).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.tools/bin:$PATH"
CLUSTER=${CLUSTER:-ringseed-e2e}
IMAGE=${IMAGE:-ringseed:e2e}
TIMEOUT=${TIMEOUT:-600}
NS=default

for tool in docker kind kubectl helm; do
  command -v "$tool" >/dev/null || { echo "kind-e2e: $tool not found; this script needs Docker, kind, kubectl and helm" >&2; exit 2; }
done
docker info >/dev/null 2>&1 || { echo "kind-e2e: no Docker engine reachable" >&2; exit 2; }

cleanup() {
  if [ "${KEEP:-0}" != 1 ]; then kind delete cluster --name "$CLUSTER" >/dev/null 2>&1 || true; fi
}
trap cleanup EXIT

wait_phase() {  # kind name phase
  local kind=$1 name=$2 phase=$3 deadline=$((SECONDS + TIMEOUT)) now
  while :; do
    now=$(kubectl -n "$NS" get "$kind" "$name" -o jsonpath='{.status.phase}' 2>/dev/null || true)
    [ "$now" = "$phase" ] && { echo "kind-e2e: $kind/$name is $phase"; return 0; }
    if [ $SECONDS -ge $deadline ]; then
      echo "kind-e2e: $kind/$name is '${now}', not $phase after ${TIMEOUT}s" >&2
      kubectl -n "$NS" describe "$kind" "$name" >&2 || true
      kubectl -n "$NS" get pods -o wide >&2 || true
      kubectl -n ringseed-system logs deploy/ringseed-operator --tail=100 >&2 || true
      return 1
    fi
    sleep 5
  done
}

echo "== kind cluster $CLUSTER (1 control plane, 2 workers)"
kind create cluster --name "$CLUSTER" --wait 120s --config - <<'KIND'
kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
nodes:
  - role: control-plane
  - role: worker
  - role: worker
KIND

echo "== image $IMAGE"
docker build -t "$IMAGE" .
kind load docker-image "$IMAGE" --name "$CLUSTER"

echo "== chart"
bash hack/verify-crds.sh
helm install ringseed charts/ringseed --namespace ringseed-system --create-namespace --wait --timeout 5m \
  --set image.repository="${IMAGE%:*}" --set image.tag="${IMAGE##*:}" --set image.pullPolicy=Never
kubectl get crd modeldistributions.ringseed.io traininggroups.ringseed.io
# hostPath volumes need the privileged Pod Security level in the namespace running agents.
kubectl label namespace "$NS" pod-security.kubernetes.io/enforce=privileged --overwrite

echo "== HTTP origin with a generated 64 MiB model"
kubectl -n "$NS" apply -f - <<ORIGIN
apiVersion: apps/v1
kind: Deployment
metadata: {name: model-origin}
spec:
  replicas: 1
  selector: {matchLabels: {app: model-origin}}
  template:
    metadata: {labels: {app: model-origin}}
    spec:
      containers:
        - name: http
          image: $IMAGE
          imagePullPolicy: Never
          command:
            - python
            - -c
            - |
              import json, os, http.server, functools
              root = "/tmp/model"
              os.makedirs(root, exist_ok=True)
              files = []
              for i, size in enumerate([40 << 20, 24 << 20, 1234]):
                  path = f"part-{i}.bin"
                  with open(os.path.join(root, path), "wb") as f:
                      f.write(os.urandom(size))
                  files.append({"path": path, "size": size, "mode": 0o644})
              with open(os.path.join(root, "index.json"), "w") as f:
                  json.dump({"files": files}, f)
              handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=root)
              http.server.ThreadingHTTPServer(("0.0.0.0", 8080), handler).serve_forever()
          ports: [{containerPort: 8080}]
          readinessProbe: {httpGet: {path: /index.json, port: 8080}}
          volumeMounts: [{name: tmp, mountPath: /tmp}]
      volumes: [{name: tmp, emptyDir: {}}]
---
apiVersion: v1
kind: Service
metadata: {name: model-origin}
spec:
  selector: {app: model-origin}
  ports: [{port: 8080, targetPort: 8080}]
ORIGIN
kubectl -n "$NS" rollout status deploy/model-origin --timeout=5m

echo "== ModelDistribution (examples/modeldistribution-http.yaml, URI pointed at the origin)"
sed "s|uri: https://models.example.com/tiny-model/|uri: http://model-origin.$NS.svc:8080/|" \
  examples/modeldistribution-http.yaml | kubectl -n "$NS" apply -f -
wait_phase md tiny-model Complete
kubectl -n "$NS" get md tiny-model
kubectl get nodes -L "models.ringseed.io/$NS.tiny-model"

echo "== TrainingGroup (examples/traininggroup.yaml with the ringseed image, which has numpy)"
sed "s|image: pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime|image: $IMAGE\n          imagePullPolicy: Never|" \
  examples/traininggroup.yaml | kubectl -n "$NS" apply -f -
wait_phase tg tiny-train Running
kubectl -n "$NS" get tg tiny-train

echo "== S3 example: accepted by the API server (dry run)"
kubectl -n "$NS" apply --dry-run=server -f examples/modeldistribution-s3.yaml

echo "== retainPolicy Retain keeps node data; deleting the resources removes their children"
kubectl -n "$NS" delete tg tiny-train --wait --timeout=2m
kubectl -n "$NS" delete md tiny-model --wait --timeout=5m
if kubectl -n "$NS" get daemonset tiny-model-agent >/dev/null 2>&1; then
  echo "kind-e2e: DaemonSet tiny-model-agent survived its ModelDistribution" >&2
  exit 1
fi
echo "kind-e2e: passed"

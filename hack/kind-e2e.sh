#!/usr/bin/env bash
# End to end on a real Kubernetes: kind cluster, ringseed image, Helm chart, a model distributed
# over HTTP to every node, and a DDP training group on the nodes holding it.
#
# It applies the same manifests as the emulated-cluster scenario (tests/e2e/test_deployed.py):
# examples/cluster/model-origin.yaml (an HTTP origin serving Range requests),
# examples/cluster/modeldistribution-http.yaml, examples/cluster/modeldistribution-file.yaml (the
# same model from a node path), examples/cluster/traininggroup-ddp.yaml and
# examples/ddp_train.py, with the same images (ringseed:dev, ringseed:dev-training).
#
# NOT RUN on the build machines: they have a Docker client without an engine, and kind cannot
# run there (no kind node image can be pulled); tests/e2e/test_deployed.py runs these manifests
# there instead, on podman. Written for a machine with Docker, kind, kubectl and helm on PATH (or
# in .tools/bin).
#
# Steps: a kind cluster (1 control plane, 4 workers, as the scenario's 4 nodes) -> docker build
# of both targets -> kind load -> helm install -> the HTTP origin -> the ModelDistribution ->
# phase Complete -> the model copied to each node's /srv/models and the file ModelDistribution ->
# Complete -> the TrainingGroup (minPeers 4) -> Running, and each worker printed its
# losses -> the S3 example checked by the API server only (dry run; no bucket here) -> delete.
#
# Env: CLUSTER (default ringseed-e2e), KEEP=1 keeps the cluster, TIMEOUT (seconds per wait, 600).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.tools/bin:$PATH"
CLUSTER=${CLUSTER:-ringseed-e2e}
IMAGE=ringseed:dev
TRAINING_IMAGE=ringseed:dev-training
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

echo "== kind cluster $CLUSTER (1 control plane, 4 workers)"
kind create cluster --name "$CLUSTER" --wait 120s --config - <<'KIND'
kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
nodes:
  - role: control-plane
  - role: worker
  - role: worker
  - role: worker
  - role: worker
KIND

echo "== images $IMAGE and $TRAINING_IMAGE"
docker build -t "$IMAGE" .
docker build -t "$TRAINING_IMAGE" --target training .
kind load docker-image "$IMAGE" "$TRAINING_IMAGE" --name "$CLUSTER"

echo "== chart"
bash hack/verify-crds.sh
helm install ringseed charts/ringseed --namespace ringseed-system --create-namespace --wait --timeout 5m \
  --set image.repository="${IMAGE%:*}" --set image.tag="${IMAGE##*:}" --set image.pullPolicy=IfNotPresent
kubectl get crd modeldistributions.ringseed.io traininggroups.ringseed.io
# hostPath volumes need the privileged Pod Security level in the namespace running agents.
kubectl label namespace "$NS" pod-security.kubernetes.io/enforce=privileged --overwrite

echo "== HTTP origin (examples/cluster/model-origin.yaml)"
kubectl apply -f examples/cluster/model-origin.yaml
kubectl -n "$NS" rollout status deploy/model-origin --timeout=5m

echo "== ModelDistribution (examples/cluster/modeldistribution-http.yaml)"
kubectl apply -f examples/cluster/modeldistribution-http.yaml
wait_phase md tiny-model Complete
kubectl -n "$NS" get md tiny-model
kubectl get nodes -L "models.ringseed.io/$NS.tiny-model"

echo "== ModelDistribution from a node path (examples/cluster/modeldistribution-file.yaml)"
origin=$(kubectl -n "$NS" get pod -l app=model-origin -o jsonpath='{.items[0].metadata.name}')
share=$(mktemp -d)
for f in $(kubectl -n "$NS" exec "$origin" -- python -c "import json; print(' '.join(f['path'] for f in json.load(open('/srv/model/index.json'))['files']))"); do
  kubectl -n "$NS" cp "$origin:/srv/model/$f" "$share/$f"
done
for node in $(kind get nodes --name "$CLUSTER"); do
  docker exec "$node" mkdir -p /srv/models/tiny-model
  docker cp "$share/." "$node:/srv/models/tiny-model/"
done
kubectl apply -f examples/cluster/modeldistribution-file.yaml
wait_phase md file-model Complete

echo "== TrainingGroup (examples/cluster/traininggroup-ddp.yaml running examples/ddp_train.py)"
kubectl -n "$NS" create configmap ddp-train --from-file=examples/ddp_train.py
kubectl apply -f examples/cluster/traininggroup-ddp.yaml
wait_phase tg tiny-train Running
deadline=$((SECONDS + TIMEOUT))
until [ "$(kubectl -n "$NS" logs -l app.kubernetes.io/instance=tiny-train,app.kubernetes.io/component=worker \
          --tail=-1 2>/dev/null | grep -c '"losses"')" -ge 4 ]; do
  [ $SECONDS -lt $deadline ] || { echo "kind-e2e: the workers did not all finish training" >&2; exit 1; }
  sleep 5
done
kubectl -n "$NS" logs -l app.kubernetes.io/instance=tiny-train,app.kubernetes.io/component=worker --tail=1

echo "== S3 example: accepted by the API server (dry run)"
kubectl -n "$NS" apply --dry-run=server -f examples/modeldistribution-s3.yaml

echo "== deleting the resources removes their children"
kubectl -n "$NS" delete tg tiny-train --wait --timeout=2m
kubectl -n "$NS" delete md tiny-model file-model --wait --timeout=5m
if kubectl -n "$NS" get daemonset tiny-model-agent >/dev/null 2>&1; then
  echo "kind-e2e: DaemonSet tiny-model-agent survived its ModelDistribution" >&2
  exit 1
fi
echo "kind-e2e: passed"

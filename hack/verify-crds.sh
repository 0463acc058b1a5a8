#!/usr/bin/env bash
# Check that the chart's CRD templates are exactly what hack/sync-crds.sh makes from crds/.
# Exit 1 with a diff when they differ (run hack/sync-crds.sh and commit the result).
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
bash hack/sync-crds.sh "$tmp"
if ! diff -ru "$tmp" charts/ringseed/templates/crds; then
  echo "verify-crds: charts/ringseed/templates/crds is out of date; run hack/sync-crds.sh" >&2
  exit 1
fi
echo "verify-crds: chart CRDs match crds/"

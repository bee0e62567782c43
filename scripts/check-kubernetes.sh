#!/usr/bin/env bash
# Validate deploy/kubernetes against the Kubernetes API schemas, offline: every
# manifest, and the kustomization's output when kubectl is installed, strictly
# (unknown fields fail) for the oldest and newest Kubernetes versions we claim;
# then the invariants the schemas cannot see (checked inline below):
# the gateway's runtime directory is the same path on the node
# and in the pod and matches KERNELGW_RUNTIME_DIR, the probes hit /readyz and
# /healthz, no service account token is mounted.
#
# The validator is PyPI's kubernetes-validate, which ships the schemas in its
# wheel: no schema is downloaded at check time. It is installed (pinned) into a
# tool venv under the kernelgw cache the first time; later runs are offline.
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=1.37.0
KUBE_VERSIONS=(1.29.0 1.37.0)
tools=${XDG_CACHE_HOME:-$HOME/.cache}/kernelgw/tools/kubernetes-validate-$VERSION
if [ ! -x "$tools/bin/kubernetes-validate" ]; then
  echo "installing kubernetes-validate $VERSION into $tools" >&2
  rm -rf "$tools"
  python3 -m venv "$tools"
  "$tools/bin/python" -m pip install -q --disable-pip-version-check "kubernetes-validate==$VERSION" >&2
fi
validate() { "$tools/bin/kubernetes-validate" --strict --quiet "$@"; }

manifests=()
for f in deploy/kubernetes/*.yaml; do
  [ "$(basename "$f")" = kustomization.yaml ] || manifests+=("$f")
done
for k in "${KUBE_VERSIONS[@]}"; do
  validate -k "$k" "${manifests[@]}"
  if command -v kubectl >/dev/null 2>&1; then
    kubectl kustomize deploy/kubernetes | validate -k "$k" -
  fi
done

"$tools/bin/python" - "${manifests[@]}" <<'EOF'
import sys
import yaml

docs = [d for path in sys.argv[1:] for d in yaml.safe_load_all(open(path)) if d]
by_kind = {(d["kind"], d["metadata"]["name"]): d for d in docs}
problems = []
settings = by_kind[("ConfigMap", "kernelgw-settings")]["data"]
runtime_dir = settings["KERNELGW_RUNTIME_DIR"]
pod = by_kind[("DaemonSet", "kernelgw-gateway")]["spec"]["template"]["spec"]
(gateway,) = [c for c in pod["containers"] if c["name"] == "gateway"]
volumes = {v["name"]: v for v in pod["volumes"]}
mounts = {m["mountPath"]: m["name"] for m in gateway["volumeMounts"]}
host = volumes.get(mounts.get(runtime_dir, ""), {}).get("hostPath", {}).get("path")
if host != runtime_dir:
    problems.append(f"KERNELGW_RUNTIME_DIR {runtime_dir} must be a hostPath of the same path (found {host})")
if gateway["readinessProbe"]["httpGet"]["path"] != "/readyz":
    problems.append("the gateway's readiness probe must ask /readyz")
if gateway["livenessProbe"]["httpGet"]["path"] != "/healthz":
    problems.append("the gateway's liveness probe must ask /healthz")
for (kind, name), d in by_kind.items():
    spec = d.get("spec", {}).get("template", {}).get("spec")
    if spec is not None and spec.get("automountServiceAccountToken") is not False:
        problems.append(f"{kind} {name} mounts a service account token")
env = {e["name"] for e in gateway.get("env", [])}
for needed in ("KERNELGW_DATABASE_URL", "KERNELGW_CLUSTER_SECRET", "KERNELGW_GATEWAY_NAME", "KERNELGW_ADVERTISE_URL"):
    if needed not in env and needed not in settings:
        problems.append(f"the gateway gets no {needed}")
for p in problems:
    print(f"deploy/kubernetes: {p}", file=sys.stderr)
sys.exit(1 if problems else 0)
EOF
echo "deploy/kubernetes: ${#manifests[@]} manifests valid for Kubernetes ${KUBE_VERSIONS[*]}"

"""An emulated Kubernetes cluster for end-to-end tests: KMock as the API server, this package as
its controllers and kubelets, pods as podman containers from ringseed's image (test code only).

- :mod:`network`: the testbed's namespaces as nodes with shaped links, a pod bridge per node and
  one netns per pod (routed pod network).
- :mod:`apiserver`: TLS in front of KMock on the control host, the CA pods trust, service-account
  tokens.
- :mod:`emulator`: the operator tests' emulator plus server-side printing (``kubectl get md``),
  RBAC for service accounts, and a core discovery fix kubectl needs.
- :mod:`podspec`: a pod spec to ``podman run`` arguments, every field honoured or refused loudly.
- :mod:`kubelet`: one pod's life on its node (volumes, init containers, restarts, probes, status).
- :mod:`cluster`: scheduling of Deployments and DaemonSets, status write-back, Service names,
  garbage collection.
- :mod:`deployed`: bringing it all up, and ``helm template | kubectl apply`` of the chart.
"""

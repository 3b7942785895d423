"""Node-agent collectors: each reads one source and knows nothing about publishing.

``usage`` (procfs, cgroup v2), ``rapl`` (powercap energy counters), ``power`` (RAPL or the
utilisation→power model), ``kube`` (the node's own Kubernetes object), ``carbon`` (grid intensity).
"""

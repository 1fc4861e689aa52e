"""computegroups on a Kubernetes cluster: deployments as Grove PodCliqueSets, claims as DRA.

`render` turns the typed deployment model into plain manifests (dicts), with
no cluster and no Kubernetes library: `cgctl render kubernetes` prints them,
and the provider applies them. The local path never imports this package.
"""

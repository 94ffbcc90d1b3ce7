"""Deployment tooling: the Kubernetes manifests (deploy/k8s) and the compose stack's end-to-end check."""

"""Deployment files: a file becomes a plan of components and shared groups, applied by reconciling with the state."""

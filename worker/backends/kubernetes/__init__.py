"""The Kubernetes backend: a training's learners as pods, observed by watch."""

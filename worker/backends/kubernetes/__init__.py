"""The Kubernetes backend: a training's learners as pods behind a headless Service, their
credentials in a per-training Secret (objects.py builds them, layout.py says what runs
where inside a pod), observed by watch (pod_states.py reads a pod as a learner state)."""

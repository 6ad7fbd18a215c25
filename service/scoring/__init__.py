"""Online scoring of deployed TensorFlow models: payloads (inputs), signatures, batching,
the model cache, rate limits, and the scoring service that ties them together.

TensorFlow is imported by `service.scoring.savedmodel` only, when a model is loaded.
`python -m service.scoring` runs the scoring service alone (see service.scoring.app).
"""

"""Online scoring of deployed TensorFlow models: payloads (inputs), signatures, batching,
the model cache, rate limits, and the scoring service that ties them together.

Each deployment's model runs in a sandboxed process of its own (`service.scoring.process`
starts and supervises it; `service.scoring.model_server` is its program, and the only
module that imports TensorFlow, inside that process).
`python -m service.scoring` runs the scoring service alone (see service.scoring.app).
"""

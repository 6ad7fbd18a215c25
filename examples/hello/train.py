"""The smallest training: prints what the platform gives every learner."""

import os

for name in ("TRAINING_ID", "LEARNER_ID", "NUM_LEARNERS", "LEARNER_NAME_PREFIX", "RESULT_DIR"):
    print(f"{name}={os.environ.get(name, '')}")
print("loss=0.0")

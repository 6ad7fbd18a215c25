"""`python -m worker.learner SPEC.json HOST.json`: run one learner (see worker.learner.wrapper)."""

from worker.learner.wrapper import main

raise SystemExit(main())

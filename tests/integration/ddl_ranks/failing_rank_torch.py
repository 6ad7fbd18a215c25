"""Run under `mpirun -np 2` in the runtime pytorch2.13: rank 1 fails (an uncaught
exception) while rank 0 waits for it in a collective. ddl's exit does not wait for the
other ranks on a failing rank, so mpirun ends the job as soon as rank 1 has exited."""

from __future__ import annotations

import ddl
import torch

if ddl.rank() == 1:
    raise RuntimeError("rank 1 fails")
ddl.all_reduce_n([torch.ones(2)], op="sum")  # never completes: rank 1 is gone
print("rank=0 was not ended", flush=True)

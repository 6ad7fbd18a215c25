"""An MPIJob launcher's `mpirun` (or `horovodrun`) line, as the program each rank runs
(pure).

On Kubeflow the launcher's command is the whole `mpirun -np 2 ... python train.py` line
users write. The platform starts its own mpirun (its hosts, slots and transports), so the
line becomes the program after mpirun's options. Each option is carried, checked against
what the platform does, or refused naming the word (a JSON pointer into the command or
args): `-np` is checked by the caller against workers x slots; `-x NAME=VALUE` sets the
variable for the program; the hosts, the mapping by slot, the binding and the transports
(`-mca btl|pml|oob...`) are the platform's, on its learners' network.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from service.domain.kubeflow_pods import Refusals, variable_refusal

MPIRUNS = frozenset({"mpirun", "mpiexec", "orterun", "prterun"})
HOROVODRUN = "horovodrun"
_SHELLS = frozenset({"sh", "bash"})
_SHELL_OPERATORS = frozenset("();<>|&")

# Option -> how many values follow it, and what it means here.
_RANKS = "ranks"
_ENV = "env"
_PLATFORM = "platform"  # what the platform decides for its learners: accepted, not carried
_MAP_BY = "map-by"
_MCA = "mca"
_MPIRUN_OPTIONS: dict[str, tuple[int, str]] = {
    **dict.fromkeys(("-np", "-n", "--np", "--n", "-c"), (1, _RANKS)),
    "-x": (1, _ENV),
    **dict.fromkeys(("--allow-run-as-root", "--oversubscribe", "-oversubscribe"), (0, _PLATFORM)),
    **dict.fromkeys(("-bind-to", "--bind-to"), (1, _PLATFORM)),
    **dict.fromkeys(("-map-by", "--map-by"), (1, _MAP_BY)),
    **dict.fromkeys(
        ("-hostfile", "--hostfile", "-machinefile", "--machinefile", "-H", "-host", "--host"),
        (1, _PLATFORM),
    ),
    **dict.fromkeys(("-mca", "--mca", "-gmca", "--gmca"), (2, _MCA)),
}
_HOROVODRUN_OPTIONS: dict[str, tuple[int, str]] = {
    **dict.fromkeys(("-np", "--num-proc"), (1, _RANKS)),
    **dict.fromkeys(("-H", "--hosts", "-hostfile", "--hostfile"), (1, _PLATFORM)),
    **dict.fromkeys(("--mpi", "--gloo"), (0, _PLATFORM)),
}
# MCA parameters that choose MPI's transports and interfaces: the platform sets its own
# for its learners' network (a Kubernetes interface name means nothing there).
_TRANSPORT_MCA = ("btl", "pml", "oob", "coll_hcoll", "mtl", "osc")


@dataclass(frozen=True)
class MpirunLine:
    """The program every rank runs, the variables `-x` gives it, and the ranks asked for."""

    program: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    ranks: int | None
    ranks_at: str


def read_mpirun_line(
    words: Sequence[str], pointers: Sequence[str], refusals: Refusals
) -> MpirunLine | None:
    """The line `words` (each written at `pointers`), or None with its refusals."""
    if not words:
        return None
    if len(words) == 3 and os.path.basename(words[0]) in _SHELLS and words[1] == "-c":
        split = _shell_words(words[2], pointers[2], refusals)
        if split is None:
            return None
        words, pointers = split, [pointers[2]] * len(split)
    if not words:
        refusals.add(pointers[0] if pointers else "", "names no mpirun line")
        return None
    runner = os.path.basename(words[0])
    if runner in MPIRUNS:
        options = _MPIRUN_OPTIONS
    elif runner == HOROVODRUN:
        options = _HOROVODRUN_OPTIONS
    else:
        refusals.add(
            pointers[0],
            f"must start with mpirun or horovodrun, the line whose program each rank runs "
            f"(the platform starts its own mpirun); got '{words[0]}'",
        )
        return None
    return _options(runner, words, pointers, options, refusals)


def _shell_words(line: str, pointer: str, refusals: Refusals) -> list[str] | None:
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        tokens = list(lexer)
    except ValueError as e:
        refusals.add(pointer, f"is not a shell line the platform can read: {e}")
        return None
    if any(token and set(token) <= _SHELL_OPERATORS for token in tokens):
        refusals.add(
            pointer,
            "is not supported: one mpirun or horovodrun command, without other shell "
            "commands, pipes or redirections",
        )
        return None
    return tokens


def _options(
    runner: str,
    words: Sequence[str],
    pointers: Sequence[str],
    options: dict[str, tuple[int, str]],
    refusals: Refusals,
) -> MpirunLine | None:
    env: list[tuple[str, str]] = []
    ranks: int | None = None
    ranks_at = pointers[0]
    i = 1
    while i < len(words):
        word = words[i]
        if word == "--":
            i += 1
            break
        if not word.startswith("-"):
            break
        name, inline = word, None
        if word.startswith("--") and "=" in word:
            name, inline = word.split("=", 1)
        if name not in options:
            refusals.add(
                pointers[i],
                f"{runner} option '{name}' is not supported: the platform starts its own "
                f"{runner if runner == HOROVODRUN else 'mpirun'}; accepted: "
                f"{', '.join(sorted(options))}",
            )
            return None
        count, meaning = options[name]
        values = [inline] if inline is not None else list(words[i + 1 : i + 1 + count])
        value_pointers = list(pointers[i + 1 : i + 1 + count]) or [pointers[i]]
        if len(values) < count or (count == 0 and inline is not None):
            refusals.add(pointers[i], f"{runner} option '{name}' takes {count} value(s)")
            return None
        i += 1 + (count if inline is None else 0)
        if meaning == _RANKS:
            try:
                ranks = int(values[0])
            except ValueError:
                refusals.add(value_pointers[0], f"{name} must be a number of ranks")
                return None
            ranks_at = value_pointers[0]
        elif meaning == _ENV:
            name_value = values[0]
            if "=" in name_value:
                variable, value = name_value.split("=", 1)
                if (why := variable_refusal(variable)) is not None:
                    refusals.add(value_pointers[0], why)
                    return None
                env.append((variable, value))
        elif meaning == _MAP_BY and values[0].split(":")[0].lower() != "slot":
            refusals.add(
                value_pointers[0],
                f"is not supported: the platform maps ranks by slot (one per GPU of each "
                f"learner); got '{values[0]}'",
            )
            return None
        elif meaning == _MCA and not values[0].startswith(_TRANSPORT_MCA):
            refusals.add(
                value_pointers[0],
                f"MCA parameter '{values[0]}' is not supported: the platform sets MPI's "
                "transports (btl, pml, oob) for its learners; other parameters are not "
                "carried",
            )
            return None
    program = tuple(words[i:])
    if not program:
        refusals.add(pointers[-1], f"names no program after {runner}'s options")
        return None
    return MpirunLine(program, tuple(env), ranks, ranks_at)

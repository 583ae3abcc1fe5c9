"""An Engine's whole training state as bytes, for torch-style state_dict() / load_state_dict().

The state is a strata checkpoint (docs/reliability.md: manifest.json and one rank<R>.bin per rank),
written by Engine.save into a scratch directory every rank sees and read back as a dict of file
name -> bytes. Both calls are collective. Loading reshards, so a state saved on 3 ranks loads on 1.
"""

import os
import shutil
import tempfile

from strata import _strata

FORMAT = "strata-checkpoint-1"


def engine_state(engine):
    """{'format', 'step', 'files': {name: bytes}}: every rank returns the same."""
    scratch = _strata.broadcast_text(tempfile.mkdtemp(prefix="strata-state-")
                                     if _strata.rank() == 0 else "")
    try:
        target = os.path.join(scratch, "checkpoint")
        engine.save(target)
        files = {}
        for name in sorted(os.listdir(target)):
            with open(os.path.join(target, name), "rb") as file:
                files[name] = file.read()
        _strata.barrier()  # every rank has read before rank 0 removes
    finally:
        if _strata.rank() == 0:
            shutil.rmtree(scratch, ignore_errors=True)
    return {"format": FORMAT, "step": engine.step_count, "files": files}


def load_engine_state(engine, state):
    """Restores what engine_state() returned (each rank from its own scratch copy)."""
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        found = state.get("format") if isinstance(state, dict) else type(state).__name__
        raise ValueError(f"not a strata optimizer state (format {found!r}, expected {FORMAT!r})")
    scratch = tempfile.mkdtemp(prefix="strata-load-")
    try:
        target = os.path.join(scratch, "checkpoint")
        os.mkdir(target)
        for name, data in state["files"].items():
            if os.path.basename(name) != name:
                raise ValueError(f"strata optimizer state: bad file name {name!r}")
            with open(os.path.join(target, name), "wb") as file:
                file.write(data)
        engine.load(target)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

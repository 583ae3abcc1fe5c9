"""An Engine's whole training state as bytes, for torch-style state_dict() / load_state_dict().

The state is a strata checkpoint (docs/reliability.md: manifest.json and one rank<R>.bin per rank),
written by Engine.save into a scratch directory that rank 0 creates and every rank sees (the ranks
share a file system, as Engine.save already requires), and read back by rank 0 alone as a dict of
file name -> bytes: one copy of the state in host memory, not one per rank. Both calls are
collective; load takes the bytes from rank 0's argument (torch practice: rank 0 saves the
state_dict, every rank loads it). Loading reshards, so a state saved on 3 ranks loads on 1.
"""

import os
import shutil
import tempfile

from strata import _strata

FORMAT = "strata-checkpoint-1"


def engine_state(engine):
    """{'format', 'step', 'files': {name: bytes}} on rank 0; 'files' is None on the others."""
    scratch = _shared_scratch("strata-state-")
    try:
        target = os.path.join(scratch, "checkpoint")
        engine.save(target)
        files = _read_files(target) if _strata.rank() == 0 else None
    finally:
        _remove_shared(scratch)
    return {"format": FORMAT, "step": engine.step_count, "files": files}


def load_engine_state(engine, state):
    """Restores what engine_state() returned on rank 0; every rank raises if rank 0's is bad."""
    _check_format(state)
    problem = _strata.broadcast_text(_bad_files(state["files"]) if _strata.rank() == 0 else "")
    if problem:
        raise ValueError(f"strata optimizer state (rank 0's): {problem}")
    scratch = _shared_scratch("strata-load-")
    try:
        target = os.path.join(scratch, "checkpoint")
        if _strata.rank() == 0:
            _write_files(target, state["files"])
        _strata.barrier()  # the files are complete before any rank reads them
        engine.load(target)
    finally:
        _remove_shared(scratch)


def _check_format(state):
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        found = state.get("format") if isinstance(state, dict) else type(state).__name__
        raise ValueError(f"not a strata optimizer state (format {found!r}, expected {FORMAT!r})")


def _bad_files(files):
    """What is wrong with rank 0's files, or "" when nothing is."""
    if not isinstance(files, dict):
        return ("it carries no checkpoint files: pass rank 0's state_dict() (the other ranks' "
                "carry none)")
    for name in files:
        if not isinstance(name, str) or os.path.basename(name) != name:
            return f"bad file name {name!r}"
    return ""


def _shared_scratch(prefix):
    """A new directory created by rank 0, its name the same on every rank."""
    return _strata.broadcast_text(tempfile.mkdtemp(prefix=prefix) if _strata.rank() == 0 else "")


def _remove_shared(scratch):
    _strata.barrier()  # every rank is done with it
    if _strata.rank() == 0:
        shutil.rmtree(scratch, ignore_errors=True)


def _read_files(directory):
    files = {}
    for name in sorted(os.listdir(directory)):
        with open(os.path.join(directory, name), "rb") as file:
            files[name] = file.read()
    return files


def _write_files(directory, files):
    os.mkdir(directory)
    for name, data in files.items():
        with open(os.path.join(directory, name), "wb") as file:
            file.write(data)

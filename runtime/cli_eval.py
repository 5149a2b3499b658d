"""`moepack eval`: the logits of a token sequence, written as .npy."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from moepack.runtime.cli import (
    BudgetOpt,
    CtxOpt,
    FileArg,
    Interrupt,
    KernelsOpt,
    KvOpt,
    ThreadsOpt,
    counted,
    engine_fail,
    err_console,
    ids_from,
    open_engine,
    require_file,
)

from moepack.cliargs import fail, one_line, token_ids

if TYPE_CHECKING:  # imported lazily at run time: `moepack --help` stays fast
    import numpy as np


def _output_problem(path: Path) -> str | None:
    """Why `path` cannot be created, or None; checked before the work, not after it."""
    parent = path.parent
    if not parent.is_dir():
        return f"folder {parent} " + ("is not a folder" if parent.exists() else "does not exist")
    if path.is_dir() and not path.is_symlink():
        return f"{path} is a folder"
    return None


def _save_npy(path: Path, array: np.ndarray) -> None:
    """Write `array` as .npy at exactly `path`: into a new file beside it, then renamed over it,
    so a failed or interrupted write (a full disk, Ctrl-C) leaves the earlier file at `path` as it
    was; a symbolic link planted at either name is replaced, never followed (safefs.open_new).
    Written with os.write, not np.save: np.save through a file object drops the tail of a short
    write (disk full) without an error."""
    import numpy as np

    from moepack.safefs import UnsafePathError, open_new

    data = np.ascontiguousarray(array)  # the header below then says C order
    tmp = path.with_name(f".moepack-eval-{os.getpid()}.tmp")  # fits whatever NAME_MAX `path` met
    try:
        fd = open_new(tmp, os.O_WRONLY, replace=True)
    except (UnsafePathError, OSError) as e:
        fail(f"cannot write {path}: {getattr(e, 'strerror', None) or e}")
    try:
        try:
            _write_all(fd, _npy_header(data))
            _write_all(fd, memoryview(data).cast("B"))
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        fail(f"cannot write {path}: {e.strerror or e}")
    except BaseException:  # Ctrl-C mid-write: no half-written file left beside
        tmp.unlink(missing_ok=True)
        raise


def _npy_header(array: np.ndarray) -> bytes:
    """The .npy (format 1.0) header np.save would write for `array`."""
    import io

    import numpy as np

    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, np.lib.format.header_data_from_array_1_0(array))
    return buf.getvalue()


def _write_all(fd: int, data: bytes | memoryview) -> None:
    """Every byte, or OSError: a short write is retried, so a full disk raises ENOSPC."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def eval_cmd(
    file: FileArg,
    tokens: Annotated[str, typer.Option(
        "--tokens", callback=token_ids, help="Comma-separated token ids.")],
    logits: Annotated[Path, typer.Option(
        "--logits", help="Output .npy: float32 \\[n, vocab], written at exactly this path.")],
    threads: ThreadsOpt = None,
    budget: BudgetOpt = None,
    ctx: CtxOpt = None,
    kv: KvOpt = None,
    kernels: KernelsOpt = "auto",
) -> None:
    """Teacher-forced logits for every position, saved as a float32 .npy."""
    from moepack.runtime.engine import Cancelled, EngineError

    ids = ids_from(tokens)
    if not ids:
        raise typer.BadParameter("no token ids given", param_hint="'--tokens'")
    problem = _output_problem(logits)
    if problem:
        raise typer.BadParameter(problem, param_hint="'--logits'")
    require_file(file)
    if ctx is not None and ctx < len(ids):  # never raised behind the user's back
        fail(f"context full: the {counted(len(ids), 'token')} need {len(ids)} positions, ctx is "
             f"{ctx} (--ctx)")
    if ctx is None:  # the context is the tokens': refused in their words, not as a --ctx
        longest = _model_max_pos(file, kv)
        if len(ids) > longest:
            fail(f"context full: the {counted(len(ids), 'token')} are more than this model's "
                 f"longest context, {counted(longest, 'token')} (max_position_embeddings)")
    eng = open_engine(file, budget=budget, threads=threads, ctx=ctx or len(ids), kv=kv,
                kernels=kernels)
    try:
        with eng, Interrupt() as stop_now:
            stop_now.also(eng.cancel)  # Ctrl-C stops the pass within a layer's work
            out = eng.logits(ids)
    except Cancelled:
        stop_now.hit = True
    except EngineError as e:
        engine_fail(e, False)
    if stop_now.hit:  # nothing written: the logits of a stopped pass are not all there
        err_console.print("interrupted: no logits written")
        raise typer.Exit(130)
    _save_npy(logits, out)
    print(f"wrote {one_line(str(logits))}: float32 {list(out.shape)}")


def _model_max_pos(file: Path, kv: str | None) -> int:
    """The model's longest context (max_position_embeddings), from its plan."""
    from moepack.runtime.engine import EngineError, plan

    try:
        return plan(str(file), kv=kv)["max_pos"]
    except EngineError as e:
        engine_fail(e, False, f"{file}: ")
    except (ValueError, OSError) as e:
        fail(f"{file}: {e}")

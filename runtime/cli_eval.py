"""`moepack eval`: the logits of a token sequence, written as .npy."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

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

from moepack.cliargs import EXIT_INTERRUPTED, fail, one_line, token_ids


def _output_problem(path: Path) -> str | None:
    """Why `path` cannot be created, or None; checked before the work, not after it."""
    parent = path.parent
    if not parent.is_dir():
        return f"folder {parent} " + ("is not a folder" if parent.exists() else "does not exist")
    if path.is_dir() and not path.is_symlink():
        return f"{path} is a folder"
    return None


class _NpyOut:
    """The float32 [n, vocab] .npy at `path`, made beside it (`.moepack-eval-PID.tmp`) with its
    whole size reserved first, so that a full disk fails before the work and never as a SIGBUS
    while the engine writes the logits through the mapping (`array`); the logits of a long
    sequence on a big vocabulary (8k tokens x 163k: 5.3 GB) then live in the page cache, not in
    memory beside the engine's budget. `commit` renames it over `path` (an earlier file stays
    until then), `discard` removes it. A symbolic link planted at either name is replaced, never
    followed (safefs.open_new)."""

    def __init__(self, path: Path, shape: tuple[int, int]) -> None:
        import numpy as np

        from moepack.durable import reserve
        from moepack.safefs import open_new

        self.path = path
        self.tmp = path.with_name(f".moepack-eval-{os.getpid()}.tmp")  # fits any NAME_MAX path met
        header = _npy_header(shape)
        size = len(header) + 4 * shape[0] * shape[1]
        fd = open_new(self.tmp, os.O_RDWR, replace=True)
        try:
            try:
                _write_all(fd, header)
                reserve(fd, size, blocks=True)
            finally:
                os.close(fd)
            self.array = np.memmap(self.tmp, np.float32, "r+", offset=len(header), shape=shape)
        except BaseException:
            self.tmp.unlink(missing_ok=True)
            raise

    def commit(self) -> None:
        self.array.flush()
        del self.array  # unmapped before the rename
        os.replace(self.tmp, self.path)

    def discard(self) -> None:
        self.__dict__.pop("array", None)
        self.tmp.unlink(missing_ok=True)


def _npy_header(shape: tuple[int, int]) -> bytes:
    """The .npy (format 1.0) header np.save would write for a C-order float32 array of `shape`."""
    import io

    import numpy as np

    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buf, {"descr": np.lib.format.dtype_to_descr(np.dtype(np.float32)),
              "fortran_order": False, "shape": tuple(shape)})
    return buf.getvalue()


def _write_all(fd: int, data: bytes | memoryview) -> None:
    """Every byte, or OSError: a short write is retried, so a full disk raises ENOSPC."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _vocab_size(file: Path) -> int:
    """The container's vocabulary (its index only: the engine is not opened yet)."""
    from moepack.format import Container, FormatError
    from moepack.runtime.engine import EngineError

    try:
        with Container.open(file) as c:
            return int(c.manifest["model"]["vocab_size"])
    except FormatError as e:
        engine_fail(EngineError.from_format(e), False, f"{file}: ")
    except (KeyError, TypeError, ValueError, OSError) as e:
        fail(f"{file}: {e}")


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
    from moepack.safefs import UnsafePathError

    shape = (len(ids), _vocab_size(file))
    try:  # before the work: a disk too small for the logits is refused now
        target = _NpyOut(logits, shape)
    except (UnsafePathError, OSError) as e:
        fail(f"cannot write {logits}: {getattr(e, 'strerror', None) or e}")
    try:
        eng = open_engine(file, budget=budget, threads=threads, ctx=ctx or len(ids), kv=kv,
                          kernels=kernels)
        try:
            with eng, Interrupt() as stop_now:
                stop_now.also(eng.cancel)  # Ctrl-C stops the pass within a layer's work
                eng.logits(ids, out=target.array)
        except Cancelled:
            stop_now.hit = True
        except EngineError as e:
            engine_fail(e, False)
        if stop_now.hit:  # nothing written: the logits of a stopped pass are not all there
            err_console.print("interrupted: no logits written")
            raise typer.Exit(EXIT_INTERRUPTED)
        target.commit()
    except OSError as e:
        fail(f"cannot write {logits}: {e.strerror or e}")
    finally:
        target.discard()  # a no-op once committed
    print(f"wrote {one_line(str(logits))}: float32 {list(shape)}")


def _model_max_pos(file: Path, kv: str | None) -> int:
    """The model's longest context (max_position_embeddings), from its plan."""
    from moepack.runtime.engine import EngineError, plan

    try:
        return plan(str(file), kv=kv)["max_pos"]
    except EngineError as e:
        engine_fail(e, False, f"{file}: ")
    except (ValueError, OSError) as e:
        fail(f"{file}: {e}")

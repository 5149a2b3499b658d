"""The `moepack serve` subcommand."""

from __future__ import annotations

import signal
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
)

from moepack.cliargs import (
    EXIT_INTERRUPTED,
    fail,
    file_problem,
    interrupted_code,
    note_stop,
    utf8_text,
)


def serve_cmd(
    file: FileArg,
    host: Annotated[str, typer.Option(
        "--host", callback=utf8_text, help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=1, max=65535, help="TCP port.")] = 8000,
    api_key: Annotated[str | None, typer.Option(
        "--api-key", callback=utf8_text,
        help="Require 'Authorization: Bearer KEY' on /v1/* and /metrics.")] = None,
    budget: BudgetOpt = None,
    ctx: CtxOpt = None,
    kv: KvOpt = None,
    threads: ThreadsOpt = None,
    kernels: KernelsOpt = "auto",
    max_queue: Annotated[int, typer.Option(
        "--max-queue", min=0,
        help="Requests waiting behind the running one (0: none); more get 429.")] = 16,
    max_body: Annotated[int, typer.Option(
        "--max-body", min=1024, help="Largest request body in bytes; larger get 413.")] = 4 << 20,
    model_name: Annotated[str | None, typer.Option(
        "--model-name", callback=utf8_text,
        help="Model id in /v1/models (default: the file's stem).")] = None,
) -> None:
    """OpenAI-compatible server (/v1/chat/completions, /v1/completions, /v1/models) and a chat
    page at /. One sequence at a time; requests queue. Ctrl-C (exit 130) and SIGTERM (exit 0)
    stop it within seconds, and the requests in flight are told so."""
    from moepack.format.errors import FormatError
    from moepack.runtime.engine import Cancelled, EngineError, OpenCancel
    from moepack.runtime.tokenizer import TokenizerError
    from moepack.serve import server
    from moepack.serve.app import ServeConfig, create_app

    problem = file_problem(file)   # before opening: a FIFO would block the engine forever
    if problem:
        fail(problem)
    cfg = ServeConfig(path=str(file), model_id=model_name or file.stem, api_key=api_key,
                      budget=budget, ctx=ctx, kv=kv, threads=threads, kernels=kernels,
                      max_queue=max_queue, max_body=max_body)
    # bound here, not by uvicorn (whose bind failure exits 3, moepack's code for a bug), and
    # before the model loads (minutes for a big one): a port in use or an address this machine
    # lacks is one error line, exit 1, at once; connections wait in the backlog meanwhile
    where = server.address(host, port)
    try:
        socks = server.listen(host, port)
    except (OSError, ValueError) as e:  # ValueError: a name IDNA cannot encode
        fail(f"cannot listen on {where}: {getattr(e, 'strerror', None) or e}")
    # a signal while the model loads stops the engine's trunk read (minutes for a big model)
    # and ends as a stop with nothing in flight: SIGTERM 0, Ctrl-C 130, SIGHUP 129
    cfg.open_cancel = OpenCancel()
    loaded = False
    try:
        with Interrupt() as stop:
            stop.also(cfg.open_cancel.set)
            app, srv = create_app(cfg)
        loaded = not stop.hit
        if stop.hit:  # it came as the last tensor was read
            srv.close()
    except Cancelled:
        pass
    except FormatError as e:  # the tokenizer's reader refused the container
        fail(f"{file}: {EngineError.from_format(e).with_code()}")
    except EngineError as e:
        fail(f"{file}: {e.with_code()}")
    except (TokenizerError, ValueError, OSError) as e:
        fail(f"{file}: {e}")
    finally:
        if not loaded:
            for sock in socks:
                sock.close()
    if not loaded:
        raise typer.Exit(0 if interrupted_code() == 128 + signal.SIGTERM else EXIT_INTERRUPTED)
    print(f"moepack serve: {cfg.model_id} on http://{where}/", flush=True)
    # the worker thread owns the engine; uvicorn's loop only routes requests
    run = server.Uvicorn(app, srv.stop_requests)
    run.run(sockets=socks)
    if run.stop_signal in (signal.SIGINT, signal.SIGHUP):  # 130, 129 (moepack.cli)
        note_stop(run.stop_signal)
        raise typer.Exit(EXIT_INTERRUPTED)



def register(app: typer.Typer) -> None:
    """Add `serve` to the `moepack` app."""
    app.command("serve")(serve_cmd)

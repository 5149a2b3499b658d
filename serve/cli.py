"""The `moepack serve` subcommand."""

from __future__ import annotations

from typing import Annotated

import typer
from moepack.runtime.cli import BudgetOpt, CtxOpt, FileArg, KernelsOpt, KvOpt, ThreadsOpt

from moepack.cliargs import fail, file_problem, utf8_text


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
        "--max-queue", min=0, help="Requests waiting behind the running one; more get 429.")] = 16,
    max_body: Annotated[int, typer.Option(
        "--max-body", min=1024, help="Largest request body in bytes; larger get 413.")] = 4 << 20,
    model_name: Annotated[str | None, typer.Option(
        "--model-name", callback=utf8_text,
        help="Model id in /v1/models (default: the file's stem).")] = None,
) -> None:
    """OpenAI-compatible server (/v1/chat/completions, /v1/completions, /v1/models) and a chat
    page at /. One sequence at a time; requests queue."""
    import uvicorn
    from moepack.format.errors import FormatError
    from moepack.runtime.engine import EngineError
    from moepack.runtime.tokenizer import TokenizerError
    from moepack.serve.app import ServeConfig, create_app

    problem = file_problem(file)   # before opening: a FIFO would block the engine forever
    if problem:
        fail(problem)
    cfg = ServeConfig(path=str(file), model_id=model_name or file.stem, api_key=api_key,
                      budget=budget, ctx=ctx, kv=kv, threads=threads, kernels=kernels,
                      max_queue=max_queue, max_body=max_body)
    try:
        app = create_app(cfg)
    except FormatError as e:  # the tokenizer's reader refused the container
        fail(f"{file}: {EngineError.from_format(e).with_code()}")
    except EngineError as e:
        fail(f"{file}: {e.with_code()}")
    except (TokenizerError, ValueError, OSError) as e:
        fail(f"{file}: {e}")
    # the worker thread owns the engine; uvicorn's loop only routes requests
    print(f"moepack serve: {cfg.model_id} on http://{host}:{port}/", flush=True)
    uvicorn.run(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=2)


def register(app: typer.Typer) -> None:
    """Add `serve` to the `moepack` app."""
    app.command("serve")(serve_cmd)

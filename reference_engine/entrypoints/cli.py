"""The ``reference-engine`` command: ``serve``, ``generate`` and ``bench``.

Engine options are made from the fields of ``AsyncEngineArgs``, so they mirror ``EngineArgs``
(``--max-num-seqs``, ``--num-kv-blocks``, ``--speculative-config '{"method": "ngram", ...}'``)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib
import json
import logging
import signal
import sys
import types
import typing
import uuid
from pathlib import Path
from typing import Any

from reference_engine.config import AsyncEngineArgs

log = logging.getLogger("reference_engine.entrypoints")


def _option_type(hint: Any) -> Any:
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if hint is bool or args == [bool]:
        return bool
    for kind in (int, float, str):
        if hint is kind or kind in args:
            return kind
    if hint is dict or dict in args or any(typing.get_origin(a) is dict for a in args):
        return json.loads
    return str


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("engine (the fields of EngineArgs)")
    hints = typing.get_type_hints(AsyncEngineArgs)
    for f in dataclasses.fields(AsyncEngineArgs):
        if f.name == "model":
            continue
        flag = "--" + f.name.replace("_", "-")
        kind = _option_type(hints[f.name])
        default = None if f.default is dataclasses.MISSING else f.default
        if kind is bool:
            group.add_argument(
                flag,
                action=argparse.BooleanOptionalAction,
                default=argparse.SUPPRESS,
                help=f"default: {default}",
            )
        else:
            metavar = "JSON" if kind is json.loads else None
            group.add_argument(
                flag,
                type=kind,
                default=argparse.SUPPRESS,
                metavar=metavar,
                help=f"default: {default}",
            )


def engine_args(ns: argparse.Namespace, **defaults: Any) -> AsyncEngineArgs:
    names = {f.name for f in dataclasses.fields(AsyncEngineArgs)}
    given = {k: v for k, v in vars(ns).items() if k in names}
    return AsyncEngineArgs(**{**defaults, **given})


def build_engine(args: AsyncEngineArgs) -> Any:
    from reference_engine import AsyncLLM

    try:
        return AsyncLLM.from_engine_args(args)
    except (ValueError, TypeError) as e:
        sys.exit(f"reference-engine: cannot start the engine: {e}")


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="reference-engine",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="an OpenAI-compatible HTTP server (like `vllm serve`)")
    serve.add_argument("model", help="a local HF model folder")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--api-key", default=None, help="require `Authorization: Bearer KEY` on /v1")
    serve.add_argument("--served-model-name", default=None, help="default: the model argument")
    serve.add_argument(
        "--shutdown-timeout",
        type=float,
        default=10.0,
        help="seconds in-flight requests get to finish on SIGINT/SIGTERM before they are aborted",
    )
    serve.add_argument(
        "--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"]
    )
    add_engine_args(serve)

    gen = sub.add_parser("generate", help="generate from one prompt in the terminal")
    gen.add_argument("model")
    gen.add_argument("prompt")
    gen.add_argument("--stream", action="store_true", help="print the text as it is generated")
    gen.add_argument("--max-tokens", type=int, default=64)
    gen.add_argument("--temperature", type=float, default=0.0)
    add_engine_args(gen)

    sub.add_parser(
        "bench", help="the throughput benchmark (benchmarks/throughput.py)", add_help=False
    )
    return parser


def cmd_serve(ns: argparse.Namespace) -> None:
    from reference_engine.entrypoints.openai.api_server import build_app, make_server

    engine = build_engine(engine_args(ns, model=ns.model, disable_log_stats=False))
    name = ns.served_model_name or ns.model
    app = build_app(engine, name, model_path=ns.model, api_key=ns.api_key, shutdown_engine=True)
    server = make_server(app, ns.host, ns.port, ns.shutdown_timeout, ns.log_level)
    # uvicorn drains on SIGINT/SIGTERM, cancels what is left (aborting it in the engine), runs the
    # lifespan's exit, then re-raises the signal under the handlers it found: make those exit 0.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        server.run()
    except KeyboardInterrupt:
        pass
    finally:
        engine.shutdown()
        log.info("Server stopped.")


async def _generate(ns: argparse.Namespace) -> None:
    from reference_engine import RequestOutputKind, SamplingParams

    engine = build_engine(engine_args(ns, model=ns.model))
    params = SamplingParams(
        max_tokens=ns.max_tokens, temperature=ns.temperature, output_kind=RequestOutputKind.DELTA
    )
    text, finish = [], None
    try:
        async for out in engine.generate(ns.prompt, params, uuid.uuid4().hex):
            text.append(out.outputs[0].text)
            finish = out.outputs[0].finish_reason
            if ns.stream:
                print(out.outputs[0].text, end="", flush=True)
    finally:
        engine.shutdown()
    print("" if ns.stream else "".join(text))
    print(f"[finish_reason={finish}]", file=sys.stderr)


def cmd_bench(argv: list[str]) -> int | None:
    # `benchmarks` is not an installed package: find it in the checkout (editable install) or
    # the working directory.
    repo = Path(__file__).resolve().parents[2]
    for root in (repo, Path.cwd()):
        if (root / "benchmarks").is_dir() and str(root) not in sys.path:
            sys.path.append(str(root))
    try:
        bench: types.ModuleType = importlib.import_module("benchmarks.throughput")
    except ImportError as e:
        sys.exit(f"reference-engine bench: run it from the repository root ({e}).")
    return bench.main(argv)


def main(argv: list[str] | None = None) -> int | None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bench"]:
        return cmd_bench(argv[1:])
    ns = make_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if ns.command == "serve":
        cmd_serve(ns)
    elif ns.command == "generate":
        try:
            asyncio.run(_generate(ns))
        except KeyboardInterrupt:
            return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())

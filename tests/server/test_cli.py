"""The ``reference-engine`` command: ``serve`` with a graceful SIGTERM, and ``generate``."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading

import httpx
import pytest

from reference_engine.entrypoints.cli import main

from .helpers import MODEL, wait_until


def _stream(url: str, max_tokens: int, result: dict) -> None:
    body = {
        "prompt": "Once upon a time",
        "max_tokens": max_tokens,
        "stream": True,
        "ignore_eos": True,
        "temperature": 0,
    }
    result["lines"] = []
    try:
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as r:
            for line in r.iter_lines():
                if line:
                    result["lines"].append(line)
    except httpx.HTTPError as e:
        result["error"] = e


def test_serve_drains_then_aborts_on_sigterm(tmp_path):
    log_file = tmp_path / "serve.log"
    cmd = [
        sys.executable,
        "-m",
        "reference_engine.entrypoints.cli",
        "serve",
        str(MODEL),
        "--port",
        "0",
        "--num-kv-blocks",
        "160",
        "--shutdown-timeout",
        "0.25",
        "--served-model-name",
        "tiny",
    ]
    with open(log_file, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True)
    try:

        def logged_url() -> str | None:
            found = re.search(r"Serving the OpenAI API at (http://\S+)/v1", log_file.read_text())
            return found.group(1) if found else None

        wait_until(
            lambda: logged_url() is not None or proc.poll() is not None,
            60,
            "the startup line with the URL",
            every=0.2,
        )
        url = logged_url()
        assert url, "the server did not start"
        # The drain is 0.25 s: ample for the short request's few tokens, while the long one's
        # 2,000 would need under 0.125 ms a token (a single stream takes about 0.5 ms a token
        # offline on a fast 2-core machine; with a 1.5 s drain it once finished in time).
        short, long = {}, {}
        threads = [
            threading.Thread(target=_stream, args=(url, n, res))
            for n, res in ((16, short), (2000, long))
        ]
        for t in threads:
            t.start()
        wait_until(
            lambda: len(short.get("lines", [])) >= 1 and len(long.get("lines", [])) >= 1,
            30,
            "both streams to start",
        )
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        for t in threads:
            t.join(timeout=10)
        # In-flight work finishes, or is aborted once the drain time is up: both streams end
        # properly.
        assert short["lines"][-1] == long["lines"][-1] == "data: [DONE]"
        assert '"finish_reason":"length"' in short["lines"][-2]
        assert '"finish_reason":"abort"' in long["lines"][-2]
        text = log_file.read_text()
        assert "aborted 1 request(s)" in text and "Server stopped" in text
        assert "Traceback" not in text
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_generate(capsys):
    assert (
        main(
            [
                "generate",
                str(MODEL),
                "Hello",
                "--max-tokens",
                "5",
                "--num-kv-blocks",
                "16",
                "--stream",
            ]
        )
        == 0
    )
    captured = capsys.readouterr()
    assert "[finish_reason=" in captured.err
    assert captured.out.strip()


def test_engine_options_mirror_engine_args():
    from reference_engine.entrypoints.cli import engine_args, make_parser

    ns = make_parser().parse_args(
        [
            "serve",
            "m",
            "--max-num-seqs",
            "3",
            "--block-size",
            "32",
            "--no-enable-prefix-caching",
            "--speculative-config",
            json.dumps({"method": "ngram", "num_speculative_tokens": 2}),
        ]
    )
    args = engine_args(ns, model=ns.model)
    assert (args.max_num_seqs, args.block_size, args.enable_prefix_caching) == (3, 32, False)
    assert args.speculative_config == {"method": "ngram", "num_speculative_tokens": 2}


def test_bench_delegates_to_the_benchmark(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "--help"])
    assert exit_info.value.code == 0
    assert "--num-prompts" in capsys.readouterr().out

